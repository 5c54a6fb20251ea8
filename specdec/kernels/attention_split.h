// A drafting copy's attention (causal passes): the cached keys are cut into pieces of kPieceKeys positions that
// threads score in parallel, and each row combines its pieces' partial softmaxes (the piece's highest score, its sum
// of exponentials and its weighted sum of values) in the order of the pieces. attention.h gives each task whole rows
// and every key they see: a one-token pass has one row per query head (three per KV head for smollm2-135m), so two
// threads split those rows and each reads every cached key and value again. Here each key is read once. The sums run
// in another order than attention.h's, so only the copy uses this: its passes need not match the target's bit for
// bit. Pieces sit at fixed positions, so a row's result depends neither on the batch nor on the thread count.
// Part of cpu_llama.cpp's translation unit, included after attention.h.
#pragma once

constexpr int64_t kPieceKeys = 128;     // keys per piece: a multiple of 16 (the cache's key blocks)
bool split_attention_enabled = true;  // tests compare it with attention.h's order (set_split_attention)

// Which sequences of a drafting copy's causal pass split their keys: those of one or two tokens (for three query
// heads a KV head), whose rows fit one chunk of score_rows. With more rows attention.h's chunks read the keys as
// often and its single pass costs less. Decided per sequence, so that a sequence's result never depends on the batch.
std::vector<uint8_t> split_sequences(int64_t S, const int64_t* off, int64_t groups) {
  std::vector<uint8_t> split(S, 0);
  for (int64_t s = 0; s < S; ++s) split[s] = split_attention_enabled && (off[s + 1] - off[s]) * groups <= kScoreRows;
  return split;
}

// Same arguments as attention() with causal order (no masks) and no window or soft cap, for the sequences `split`
// marks; scale: the scores' factor.
template <typename KV>
void attention_split_keys(int64_t nh, int64_t nkv, int64_t hd, const float* qkv, int64_t qkv_width, const KV* kc,
                          const KV* vc, int64_t P, int64_t S, const int64_t* off, const int64_t* slot,
                          const int64_t* start, float* out, const std::vector<uint8_t>& split, float scale) {
  const int64_t groups = nh / nkv, part = hd + 2;  // a partial: highest score, sum of exponentials, hd value sums
  struct Chunk { int64_t s, g, first, rows, pieces, partials; };  // rows share every key load (score_rows)
  std::vector<Chunk> chunks;
  std::vector<std::array<int64_t, 2>> tasks;  // chunk, piece
  int64_t partials = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t g = 0; g < nkv && split[s]; ++g) {
      const int64_t rows = (off[s + 1] - off[s]) * groups, keys = start[s] + off[s + 1] - off[s];
      const int64_t pieces = (keys + kPieceKeys - 1) / kPieceKeys;
      for (int64_t r = 0; r < rows; r += kScoreRows) {
        const int64_t n = std::min<int64_t>(kScoreRows, rows - r);
        for (int64_t p = 0; p < pieces; ++p) tasks.push_back({static_cast<int64_t>(chunks.size()), p});
        chunks.push_back({s, g, r, n, pieces, partials});
        partials += pieces * n;
      }
    }
  std::vector<float> partial(partials * part);
  at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t w0, int64_t w1) {
    std::vector<float> scores;
    int64_t visible[kScoreRows];
    const float* wptr[kScoreRows];
    float* aptr[kScoreRows];
    for (int64_t w = w0; w < w1; ++w) {
      const Chunk& c = chunks[tasks[w][0]];
      const int64_t piece = tasks[w][1], base = start[c.s];
      const int64_t p0 = piece * kPieceKeys, p1 = std::min(p0 + kPieceKeys, base + off[c.s + 1] - off[c.s]);
      const int64_t blocks = (p1 - p0 + 15) / 16, width = blocks * 16;
      const int64_t head = (slot[c.s] * nkv + c.g) * P * hd;
      const float* q[kScoreRows];
      for (int64_t r = 0; r < c.rows; ++r) {
        const int64_t row = c.first + r;
        q[r] = qkv + (off[c.s] + row / groups) * qkv_width + (c.g * groups + row % groups) * hd;
      }
      scores.assign(c.rows * width, 0.0f);
      score_rows(c.rows, q, kc + head + p0 * hd, hd, blocks, scale, scores.data(), width);
      int64_t shared = p1 - p0;
      for (int64_t r = 0; r < c.rows; ++r) {
        float* pr = &partial[(c.partials + piece * c.rows + r) * part];
        std::fill(pr, pr + part, 0.0f);
        pr[0] = -INFINITY;
        const int64_t t = (c.first + r) / groups;  // row r's token sees keys up to base + t
        visible[r] = std::clamp<int64_t>(base + t + 1 - p0, 0, p1 - p0);
        shared = std::min(shared, visible[r]);
        float* wr = &scores[r * width];
        float top = -INFINITY;
        for (int64_t i = 0; i < visible[r]; ++i) top = std::max(top, wr[i]);
        pr[0] = top;
        pr[1] = exp_shifted(wr, visible[r], top);
        wptr[r] = wr;
        aptr[r] = pr + 2;
      }
      const KV* vpiece = vc + head + p0 * hd;
      accumulate(hd / 16, c.rows, wptr, 0, shared, vpiece, hd, aptr);
      for (int64_t r = 0; r < c.rows; ++r) accumulate(hd / 16, 1, wptr + r, shared, visible[r], vpiece, hd, aptr + r);
    }
  });
  // each row: its pieces' partials, rescaled to the highest score of all, in the order of the pieces
  at::parallel_for(0, static_cast<int64_t>(chunks.size()), 1, [&](int64_t c0, int64_t c1) {
    for (int64_t ci = c0; ci < c1; ++ci) {
      const Chunk& c = chunks[ci];
      for (int64_t r = 0; r < c.rows; ++r) {
        float top = -INFINITY;
        for (int64_t p = 0; p < c.pieces; ++p) top = std::max(top, partial[(c.partials + p * c.rows + r) * part]);
        float total = 0.0f;
        std::vector<float> acc(hd, 0.0f);
        for (int64_t p = 0; p < c.pieces; ++p) {
          const float* pr = &partial[(c.partials + p * c.rows + r) * part];
          if (pr[1] == 0.0f) continue;  // a piece past the row's token
          const float weight = std::exp(pr[0] - top);
          total += weight * pr[1];
          for (int64_t d = 0; d < hd; ++d) acc[d] += weight * pr[2 + d];
        }
        const int64_t row = c.first + r;
        float* o = out + (off[c.s] + row / groups) * nh * hd + (c.g * groups + row % groups) * hd;
        for (int64_t d = 0; d < hd; ++d) o[d] = acc[d] / total;
      }
    }
  });
}
