// Attention over the KV cache: scores in blocks of 16 cached keys, softmax and value sums in a fixed order per
// row, so a row's output depends only on the keys it sees. Part of cpu_llama.cpp's translation unit.
#pragma once

// How far ahead the passes over the cache fetch on AVX2 builds: the keys' block two blocks on (scores), the value
// row 32 keys on (value sums). A decoding step's keys and values come from memory (the weights' stream evicts them
// between steps), and the loads waited on them: `perf` put half of score_rows' samples and two thirds of
// accumulate_rows' on the instruction after a cache load. With the fetches, one-token passes over 16 sequences of
// 250-640 cached tokens ran 7-13% faster on a Zen 3, over one sequence of 800 tokens 5-12%, and the same bits (what is
// read, and in which order, is unchanged). AVX-512 builds were not measured with them, so they fetch nothing.
#ifdef SPECDEC_AVX512
constexpr int64_t kScoreAheadBlocks = 0, kValueAheadRows = 0;
#else
constexpr int64_t kScoreAheadBlocks = 2, kValueAheadRows = 32;
#endif

// Attention scores of R query rows against blocks of 16 cached keys ([blocks][hd][16]): scores[r * width + j] =
// scale * sum over d in increasing order of q[r][d] k_j[d]. R is a template argument so the accumulators stay in
// registers.
template <int R, typename KV>
void score_block_rows(const float* const* q, const KV* kbase, int64_t hd, int64_t blocks, float scale,
                      float* scores, int64_t width) {
  for (int64_t b = 0; b < blocks; ++b) {
    const KV* kb = kbase + b * hd * 16;
    f32x16 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = vec::zero();
    const char* ahead = reinterpret_cast<const char*>(kb + kScoreAheadBlocks * hd * 16);
    constexpr int64_t dims_a_line = 64 / (16 * sizeof(KV));  // a block's rows of 16 keys are 32 or 64 bytes
    for (int64_t d = 0; d < hd; ++d) {
      if (kScoreAheadBlocks && d % dims_a_line == 0) _mm_prefetch(ahead + d * 16 * sizeof(KV), _MM_HINT_T0);
      const f32x16 kv = load_kv(kb + d * 16);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) acc[r] = vec::fmadd(vec::set1(q[r][d]), kv, acc[r]);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) vec::store(scores + r * width + b * 16, vec::mul(acc[r], vec::set1(scale)));
  }
}

#ifdef SPECDEC_AVX512
constexpr int kScoreRows = 8;  // query rows sharing each key load (their accumulators stay in registers)
#else
constexpr int kScoreRows = 4;
#endif

template <int R = kScoreRows, typename KV>
void score_rows(int64_t rows, const float* const* q, const KV* kbase, int64_t hd, int64_t blocks, float scale,
                float* scores, int64_t width) {
  if (rows > kScoreRows) {  // each row's scores are its own: splitting the rows changes nothing in them
    score_rows(kScoreRows, q, kbase, hd, blocks, scale, scores, width);
    return score_rows(rows - kScoreRows, q + kScoreRows, kbase, hd, blocks, scale, scores + kScoreRows * width, width);
  }
  if constexpr (R > 0) {
    if (rows == R) return score_block_rows<R, KV>(q, kbase, hd, blocks, scale, scores, width);
    score_rows<R - 1, KV>(rows, q, kbase, hd, blocks, scale, scores, width);
  }
}

constexpr int kMaxAttentionRows = 8;  // query rows a task of attention (or of attention_split) shares its loads among

// Value sums of R attention rows over consecutive keys [i0, i1): acc_r[d] += w_r[i] v[i][d], i in increasing order,
// for DV vectors of 16 lanes of d (v rows of hd floats). The rows share every load of v; each row's sum is the
// same chain of fused multiply-adds as if it ran alone, so a row's result does not depend on its neighbours.
template <int R, int DV, typename KV>
void accumulate_rows(const float* const* w, int64_t i0, int64_t i1, const KV* v, int64_t hd, float* const* acc) {
  f32x16 a[R][DV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < DV; ++j) a[r][j] = vec::load(acc[r] + j * 16);
  for (int64_t i = i0; i < i1; ++i) {
    const KV* row = v + i * hd;
    if constexpr (kValueAheadRows > 0)  // the line of this pass's slice of d (AVX2 passes read 16 d, 32 or 64 bytes)
      _mm_prefetch(reinterpret_cast<const char*>(row + kValueAheadRows * hd), _MM_HINT_T0);
    f32x16 vv[DV];
#pragma GCC unroll 16
    for (int j = 0; j < DV; ++j) vv[j] = load_kv(row + j * 16);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const f32x16 wi = vec::set1(w[r][i]);
#pragma GCC unroll 16
      for (int j = 0; j < DV; ++j) a[r][j] = vec::fmadd(wi, vv[j], a[r][j]);
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < DV; ++j) vec::store(acc[r] + j * 16, a[r][j]);
}

// rows sharing one pass over v: as many as keep the accumulators in registers
#ifdef SPECDEC_AVX512
constexpr int rows_per_pass(int dv) { return dv <= 4 ? 4 : dv <= 8 ? 2 : 1; }
// vectors of 16 lanes of d a pass over v takes: all of them
constexpr int slice_vectors(int dv) { return dv; }
#else
constexpr int rows_per_pass(int dv) { return dv <= 1 ? 4 : dv <= 2 ? 2 : 1; }
// AVX2's 16 registers hold one row's sums of a 64-wide head (8) beside its values (8), so each of a head group's rows
// would take its own pass over v, widening every bfloat16 value once a row; a pass over one vector of d at a time
// holds 4 rows' sums, so each value is widened once for 4 rows. A row's sum of each d is the same chain either way.
constexpr int slice_vectors(int dv) { return dv <= 1 ? dv : 1; }
#endif

// the last `rows` (fewer than a pass holds) in one pass over v, so that a head group of 3 query rows (smollm2's) reads
// its values once, not three times
template <int R, int DV, typename KV>
void accumulate_rest(int64_t rows, const float* const* w, int64_t i0, int64_t i1, const KV* v, int64_t hd,
                     float* const* acc) {
  if constexpr (R > 0) {
    if (rows == R) return accumulate_rows<R, DV, KV>(w, i0, i1, v, hd, acc);
    accumulate_rest<R - 1, DV, KV>(rows, w, i0, i1, v, hd, acc);
  }
}

template <int DV, typename KV>
void accumulate_slice(int64_t rows, const float* const* w, int64_t i0, int64_t i1, const KV* v, int64_t hd,
                      float* const* acc) {
  constexpr int R = rows_per_pass(DV);
  int64_t r = 0;
  for (; r + R <= rows; r += R) accumulate_rows<R, DV, KV>(w + r, i0, i1, v, hd, acc + r);
  accumulate_rest<R - 1, DV, KV>(rows - r, w + r, i0, i1, v, hd, acc + r);
}

// rows (at most kMaxAttentionRows) of value sums over DV vectors of d, in passes over slices of slice_vectors(DV)
template <int DV, typename KV>
void accumulate_some(int64_t rows, const float* const* w, int64_t i0, int64_t i1, const KV* v, int64_t hd,
                     float* const* acc) {
  constexpr int SL = slice_vectors(DV);
  if constexpr (SL == DV) {
    accumulate_slice<DV, KV>(rows, w, i0, i1, v, hd, acc);
  } else {
    static_assert(DV % SL == 0, "a head's vectors of d split into whole slices");
    float* sliced[kMaxAttentionRows];
    for (int c = 0; c < DV; c += SL) {
      for (int64_t r = 0; r < rows; ++r) sliced[r] = acc[r] + c * 16;
      accumulate_slice<SL, KV>(rows, w, i0, i1, v + c * 16, hd, sliced);
    }
  }
}

template <int DV = 16, typename KV>
void accumulate(int64_t dv, int64_t rows, const float* const* w, int64_t i0, int64_t i1, const KV* v, int64_t hd,
                float* const* acc) {
  if constexpr (DV > 0) {
    if (dv == DV) return accumulate_some<DV, KV>(rows, w, i0, i1, v, hd, acc);
    accumulate<DV - 1, KV>(dv, rows, w, i0, i1, v, hd, acc);
  }
}

// How a layer's attention scores: scale (the scores' factor), softcap (0: none; else scores -> cap * tanh(s / cap)),
// window (0: none) and pos (N,): the new tokens' positions, which a window reads.
struct AttentionShape {
  float scale, softcap;
  int64_t window;
  const int64_t* pos;
};

// Whether token i's position is above `from` (always, for from < 0: no window).
inline bool pos_after(const int64_t* pos, int64_t i, int64_t from) { return from < 0 || pos[i] > from; }

// Attention of every new token, per sequence s and KV head g: the rows are (token t, head h of group g).
// Row (t, h) sees keys [0, start_s) and the new tokens its mask allows (causal: u <= t). Scores come in
// blocks of 16 keys, score = sum over d in increasing order of q[d] k[d]; the softmax sum and the
// weighted sum of values run over the visible keys in increasing order.
// nh query heads share nkv KV heads of hd floats; qkv (N, qkv_width) holds each token's q, k and v after RoPE;
// kc, vc: one layer's cache (slots, nkv, P, hd), keys in blocks of 16 positions; out (N, nh * hd). skip: sequences
// left to attention_split_keys (none if null). With a window (shape.window > 0) a token at position p sees only the
// keys at positions > p - window: cached key j sits at position j, new token u at its position shape.pos.
template <typename KV>
void attention(int64_t nh, int64_t nkv, int64_t hd, const float* qkv, int64_t qkv_width, const KV* kc,
               const KV* vc, int64_t P, int64_t S, const int64_t* off, const int64_t* slot, const int64_t* start,
               bool causal, int64_t T, const uint8_t* mask, float* out, const AttentionShape& shape,
               const std::vector<uint8_t>* skip = nullptr) {
  const int64_t groups = nh / nkv;
  const float scale = shape.scale;
  const int64_t window = shape.window;
  const int64_t* pos = shape.pos;
  // tasks: (sequence, KV head, chunk of query rows); a chunk shares every key load among its rows, so chunks are
  // as large as the registers allow (8 rows) while every thread still gets two tasks. One row per task would read
  // each cached key once per query row: a verify pass over 3-5 tokens at an 800-token context cost 10-16% more.
  // A head whose rows fit one chunk is never split: its chunks would each read all its keys, and a decoding step
  // is bound by those reads (smollm2's one-token pass read each head's keys twice, 3 heads as 6 tasks).
  const int64_t wanted = 2 * static_cast<int64_t>(at::get_num_threads());
  const int64_t splits = std::max<int64_t>(1, (wanted + S * nkv - 1) / (S * nkv));
  std::vector<std::array<int64_t, 4>> tasks;  // s, g, first row, row count
  for (int64_t s = 0; s < S; ++s)
    for (int64_t g = 0; g < nkv && !(skip && (*skip)[s]); ++g) {
      const int64_t rows = (off[s + 1] - off[s]) * groups;
      const int64_t chunk =
          rows <= kMaxAttentionRows ? rows : std::clamp<int64_t>((rows + splits - 1) / splits, 1, kMaxAttentionRows);
      // causal chunks cost in proportion to the keys they see, which grow down the rows: listed first, last,
      // second, second last..., so that the threads' consecutive shares of the list cost about the same
      const int64_t chunks = (rows + chunk - 1) / chunk;
      for (int64_t i = 0; i < chunks; ++i) {
        const int64_t c = i % 2 ? chunks - 1 - i / 2 : i / 2;
        tasks.push_back({s, g, c * chunk, std::min(chunk, rows - c * chunk)});
      }
    }
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores, weights, acc;
    std::vector<int64_t> tail_keys;
    int64_t lowest[kMaxAttentionRows], contig[kMaxAttentionRows], count[kMaxAttentionRows];
    float inv_totals[kMaxAttentionRows];
    const float* wptr[kMaxAttentionRows];
    float* aptr[kMaxAttentionRows];
    for (int64_t w = w0; w < w1; ++w) {
      const int64_t s = tasks[w][0], g = tasks[w][1], first = tasks[w][2], rows = tasks[w][3];
      const int64_t Ts = off[s + 1] - off[s], base = start[s];
      // causal rows see no key past their own token: score only the blocks up to the chunk's last row
      const int64_t keys = causal ? base + (first + rows - 1) / groups + 1 : base + Ts;
      const int64_t blocks = (keys + 15) / 16, width = blocks * 16;
      // the first key any row sees (a window hides the older ones)
      for (int64_t r = 0; r < rows; ++r)
        lowest[r] = window ? std::max<int64_t>(0, pos[off[s] + (first + r) / groups] - window + 1) : 0;
      const int64_t skipped = *std::min_element(lowest, lowest + rows) / 16;  // blocks no row sees
      scores.resize(rows * width);  // each row's scores are written from its first visible block on
      const KV* kbase = kc + (slot[s] * nkv + g) * P * hd;
      const KV* vbase = vc + (slot[s] * nkv + g) * P * hd;
      const float* q[8];
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = first + r;
        q[r] = qkv + (off[s] + row / groups) * qkv_width + (g * groups + row % groups) * hd;
      }
      score_rows(rows, q, kbase + skipped * hd * 16, hd, blocks - skipped, scale, scores.data() + skipped * 16,
                 width);
      // Each row sees keys [lowest, base) and the new tokens its mask (and window) allows, in increasing order: the
      // first of them are keys lowest, lowest + 1, ... up to contig[r] (all of them for causal rows), the rest are
      // listed in tail_keys.
      const int64_t stride = (base + Ts + 15) / 16 * 16;
      weights.resize(rows * stride);  // a row's weights are read only where written: [lowest, count)
      // causal rows without a window see every key from the first up to their own token, in order: no tail
      const bool in_order = causal && !window;
      if (!in_order) tail_keys.resize(rows * Ts);
      acc.assign(rows * hd, 0.0f);
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t row = first + r, t = row / groups, lo = lowest[r];
        const int64_t seen_from = window ? pos[off[s] + t] - window : -1;  // positions above this are in the window
        const float* sc = &scores[r * width];
        int64_t n = std::max(lo, base), tails = 0;
        if (in_order) n = base + t + 1;  // what the loop below finds for such a row, without its Ts steps
        else
          for (int64_t u = 0; u < Ts; ++u)
            if ((causal ? u <= t : mask[(s * T + t) * T + u] != 0) && pos_after(pos, off[s] + u, seen_from)) {
              if (tails == 0 && base + u == n) ++n;  // still consecutive
              else tail_keys[r * Ts + tails++] = base + u;
            }
        contig[r] = n;
        count[r] = n + tails;
        // Softmax over the visible keys in increasing order: a token's attention depends on which keys it
        // sees, never on where they sit in the cache (a tree node and its compacted path agree bit for bit).
        const int64_t* tk = in_order ? nullptr : &tail_keys[r * Ts];
        float* wr = &weights[r * stride];
        std::copy(sc + lo, sc + n, wr + lo);
        for (int64_t i = 0; i < tails; ++i) wr[n + i] = sc[tk[i]];
        if (shape.softcap != 0.0f) soft_cap(wr + lo, count[r] - lo, shape.softcap);
        float top = -INFINITY;
        for (int64_t i = lo; i < count[r]; ++i) top = std::max(top, wr[i]);
        inv_totals[r] = 1.0f / exp_shifted(wr + lo, count[r] - lo, top);
        wptr[r] = wr;
        aptr[r] = &acc[r * hd];
      }
      // value sums in increasing key order: each row's keys below those every row sees, those every row sees
      // together (sharing each load of v), then each row's own
      const int64_t shared_from = *std::max_element(lowest, lowest + rows);
      const int64_t shared_to = *std::min_element(contig, contig + rows);
      const bool together = shared_to > shared_from;
      for (int64_t r = 0; r < rows; ++r)
        accumulate(hd / 16, 1, wptr + r, lowest[r], together ? shared_from : contig[r], vbase, hd, aptr + r);
      if (together) accumulate(hd / 16, rows, wptr, shared_from, shared_to, vbase, hd, aptr);
      for (int64_t r = 0; r < rows; ++r) {
        if (together) accumulate(hd / 16, 1, wptr + r, shared_to, contig[r], vbase, hd, aptr + r);
        const float* wr = wptr[r];
        float* a = aptr[r];
        for (int64_t i = contig[r]; i < count[r]; ++i) {
          const f32x16 wi = vec::set1(wr[i]);
          const KV* vrow = vbase + tail_keys[r * Ts + (i - contig[r])] * hd;
          for (int64_t d = 0; d < hd; d += 16) vec::store(a + d, vec::fmadd(wi, load_kv(vrow + d), vec::load(a + d)));
        }
        const int64_t row = first + r, t = row / groups;
        float* o = out + (off[s] + t) * nh * hd + (g * groups + row % groups) * hd;
        const f32x16 inv_total = vec::set1(inv_totals[r]);
        for (int64_t d = 0; d < hd; d += 16) vec::store(o + d, vec::mul(vec::load(a + d), inv_total));
      }
    }
  });
}
