// Matrix products on weights packed in blocks of 64 output rows: the tiles that multiply MR rows of x by one block,
// float32 or bfloat16 (vdpbf16ps) products, and each output's fixed reduction order (see cpu_llama.cpp).
// Part of cpu_llama.cpp's translation unit, inside its anonymous namespace.
#pragma once

// F32, BF16, F16: weights widened to float32, products of float32 activations (fused multiply-add).
// BF16PAIRS: the same products from bfloat16 weights packed in pairs of k (the layout BF16DOT reads), so that
// one packed copy serves both kinds of product.
// BF16DOT: bfloat16 weights and activations rounded to bfloat16 at the product's input, pairs of
// products summed by vdpbf16ps into float32 (twice the arithmetic rate; everything else stays float32).
enum WType : int { F32 = 0, BF16 = 1, F16 = 2, BF16DOT = 3, BF16PAIRS = 4 };

template <int WT>
inline f32x16 load16(const void* base, int64_t k) {
  if constexpr (WT == BF16) {
    return vec::load_bf16(static_cast<const uint16_t*>(base) + k);
  } else if constexpr (WT == F16) {
    return vec::load_f16(static_cast<const uint16_t*>(base) + k);
  } else {
    return vec::load(static_cast<const float*>(base) + k);
  }
}

inline f32x16 load16_any(const void* base, int64_t k, int wtype) {
  switch (wtype) {
    case BF16: return load16<BF16>(base, k);
    case F16: return load16<F16>(base, k);
    default: return load16<F32>(base, k);
  }
}

inline int64_t elem_size(int wtype) { return wtype == F32 ? 4 : 2; }

// Weights are packed once into blocks of 64 output rows (4 vectors of 16 lanes, one output per lane), so that
// a block is read as one sequential stream (rows past N are zero): block b holds W[64b + i, k] at [k][i] (AVX2
// builds: [i/16][k][i%16], see packed_at), or for bfloat16 products at [k/2][i][k%2] (pairs of adjacent k for
// vdpbf16ps). K is a multiple of 16.
constexpr int kBlockCols = 64;
constexpr int kVecs = kBlockCols / 16;

// Where W[64b + 16v + i, k] sits in block b (in elements; pairs aside). AVX-512 reads a block's four vectors of 16
// columns together: [k][64]. AVX2 reads fewer at a time, so each vector of 16 columns is a stream of its own,
// [v][k][16], whose every cache line a pass uses whole.
inline __attribute__((always_inline)) int64_t packed_at(int64_t k, int v, int64_t K) {
#ifdef SPECDEC_AVX512
  (void)K;
  return k * kBlockCols + v * 16;
#else
  return (v * K + k) * 16;
#endif
}
// Rows of x per tile, and how many of a block's vectors of 16 columns one pass over k takes (the rest take more
// passes) for MR rows: as many accumulators as the registers hold, and enough of them for the multiply-adds to
// overlap. AVX-512: 6 x 4 accumulators + 4 weight vectors + 1 broadcast of 32 registers. AVX2 (16 registers, two to
// a vector): 8 accumulator registers at most (4 x 1, 2 x 2 or 1 x 4 vectors), weights and broadcast beside them.
#ifdef SPECDEC_AVX512
constexpr int kMaxRows = 6;
constexpr int pass_vecs(int) { return kVecs; }
#else
constexpr int kMaxRows = 6;
constexpr int pass_vecs(int rows) { return rows == 1 ? 4 : 1; }
#endif

// How many leading lanes of a block's 16-column vector v hold outputs (columns < valid), and the bias there
// (zeros without one): what a block's products store.
inline __attribute__((always_inline)) int live_lanes(int valid, int v) {
  return std::clamp(valid - v * 16, 0, 16);
}

inline __attribute__((always_inline)) f32x16 bias_lanes(const float* bias, int v, int live) {
  return bias ? vec::load_first(live, bias + v * 16) : vec::zero();
}

// Stores MR rows of a tile's accumulators for the block's column vectors [v0, v0 + NV): acc + bias, only in the
// lanes that hold outputs.
template <int MR, int NV>
inline __attribute__((always_inline)) void store_tile(const f32x16 (&acc)[MR][NV], int v0, int valid,
                                                      const float* __restrict bias, float* __restrict y, int64_t ldy) {
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int live = live_lanes(valid, v0 + v);
    if (!live) break;
    const f32x16 b = bias_lanes(bias, v0 + v, live);
#pragma GCC unroll 6
    for (int j = 0; j < MR; ++j) vec::store_first(live, y + j * ldy + (v0 + v) * 16, vec::add(acc[j][v], b));
  }
}

#ifdef SPECDEC_AVX512
// tile's products from weights packed in pairs of k (BF16DOT, BF16PAIRS): AVX-512 builds only
template <int MR, int WT>
inline __attribute__((always_inline)) void tile_pairs(const void* __restrict xv, int64_t K,
                                                      const char* __restrict block, int valid,
                                                      const float* __restrict bias, float* __restrict y, int64_t ldy) {
  __m512 acc[MR][kVecs];
#pragma GCC unroll 6
  for (int j = 0; j < MR; ++j)
#pragma GCC unroll 4
    for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm512_setzero_ps();
  const uint16_t* w = reinterpret_cast<const uint16_t*>(block);
  if constexpr (WT == BF16DOT) {
    const uint16_t* x = static_cast<const uint16_t*>(xv);
    for (int64_t k = 0; k < K; k += 2) {
      __m512bh wk[kVecs];
#pragma GCC unroll 4
      for (int v = 0; v < kVecs; ++v) wk[v] = (__m512bh)_mm512_loadu_si512(w + k * kBlockCols + v * 32);
#pragma GCC unroll 6
      for (int j = 0; j < MR; ++j) {
        int32_t pair;
        std::memcpy(&pair, x + j * K + k, sizeof(pair));
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], wk[v], xb);
      }
    }
  } else {
    // the pair layout holds W[k] in the low and W[k + 1] in the high half of each 32-bit lane; k, then k + 1
    const float* x = static_cast<const float*>(xv);
    const __m512i high = _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    for (int64_t k = 0; k < K; k += 2) {
      for (int half = 0; half < 2; ++half) {
        __m512 wk[kVecs];
#pragma GCC unroll 4
        for (int v = 0; v < kVecs; ++v) {
          const __m512i raw = _mm512_loadu_si512(w + k * kBlockCols + v * 32);
          wk[v] = _mm512_castsi512_ps(half ? _mm512_and_si512(raw, high) : _mm512_slli_epi32(raw, 16));
        }
#pragma GCC unroll 6
        for (int j = 0; j < MR; ++j) {
          const __m512 xb = _mm512_set1_ps(x[j * K + k + half]);
#pragma GCC unroll 4
          for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm512_fmadd_ps(wk[v], xb, acc[j][v]);
        }
      }
    }
  }
  store_tile<MR, kVecs>(acc, 0, valid, bias, y, ldy);
}
#endif

// One row of x (a decoding step) reads each weight once: the tile waits on memory. AVX2 builds prefetch each of its
// four weight streams kPrefetchBytes ahead, once a cache line, which on Zen 3 raised one core's decoding step rate by
// 1% to 4% (docs/experiments/qwen3_cpu_bandwidth.md). AVX-512 builds, whose block is one stream, do without.
#ifdef SPECDEC_AVX512
constexpr int64_t kPrefetchBytes = 0;
#else
constexpr int64_t kPrefetchBytes = 1024;
#endif

template <int WT, int NV>
inline __attribute__((always_inline)) void prefetch_streams(const char* block, int64_t k, int v0, int64_t K) {
  constexpr int64_t es = WT == F32 ? 4 : 2, ks_per_line = 64 / (16 * es);
  if (k % ks_per_line) return;
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) _mm_prefetch(block + packed_at(k, v0 + v, K) * es + kPrefetchBytes, _MM_HINT_T0);
}

// y[j, n + i] = sum_k x[j, k] W[n + i, k] (+ bias[i]) for the 64 outputs of one packed block and MR rows of x.
// Each output accumulates in one lane, over k in increasing order (pairs of k for BF16DOT): the order depends on
// nothing but K. x is float32, or bfloat16 for BF16DOT. Outputs i >= valid are computed but not stored. The
// block's vectors of 16 columns are taken pass_vecs(MR) at a time.
template <int MR, int WT>
__attribute__((noinline)) void tile(const void* __restrict xv, int64_t K, const char* __restrict block, int valid,
                                    const float* __restrict bias, float* __restrict y, int64_t ldy) {
#ifdef SPECDEC_AVX512
  if constexpr (WT == BF16DOT || WT == BF16PAIRS) {
    tile_pairs<MR, WT>(xv, K, block, valid, bias, y, ldy);
  } else
#endif
  {
    constexpr int kPassVecs = pass_vecs(MR);
    const float* x = static_cast<const float*>(xv);
    for (int v0 = 0; v0 < kVecs && live_lanes(valid, v0); v0 += kPassVecs) {
      f32x16 acc[MR][kPassVecs];
#pragma GCC unroll 6
      for (int j = 0; j < MR; ++j)
#pragma GCC unroll 4
        for (int v = 0; v < kPassVecs; ++v) acc[j][v] = vec::zero();
      for (int64_t k = 0; k < K; ++k) {
        if constexpr (kPrefetchBytes > 0 && MR == 1) prefetch_streams<WT, kPassVecs>(block, k, v0, K);
        f32x16 wk[kPassVecs];
#pragma GCC unroll 4
        for (int v = 0; v < kPassVecs; ++v) wk[v] = load16<WT>(block, packed_at(k, v0 + v, K));
#pragma GCC unroll 6
        for (int j = 0; j < MR; ++j) {
          const f32x16 xb = vec::set1(x[j * K + k]);
#pragma GCC unroll 4
          for (int v = 0; v < kPassVecs; ++v) acc[j][v] = vec::fmadd(wk[v], xb, acc[j][v]);
        }
      }
      store_tile<MR, kPassVecs>(acc, v0, valid, bias, y, ldy);
    }
  }
}

template <int WT, int MR = kMaxRows>
void tile_rows(int64_t rows, const void* x, int64_t K, const char* block, int valid, const float* bias, float* y,
               int64_t ldy) {
  if constexpr (MR > 0) {
    if (rows == MR) return tile<MR, WT>(x, K, block, valid, bias, y, ldy);
    tile_rows<WT, MR - 1>(rows, x, K, block, valid, bias, y, ldy);
  }
}

// y (M, ldy) columns [0, N) = x (M, K) @ W^T (+ bias); x float32, or bfloat16 for BF16DOT.
template <int WT>
void linear_blocks(const void* x, int64_t M, const char* packed, int64_t N, int64_t K, const float* bias, float* y,
                   int64_t ldy) {
  constexpr int64_t ES = WT == F32 ? 4 : 2;  // bytes per weight
  constexpr int64_t XS = WT == BF16DOT ? 2 : 4;  // bytes per activation
  const int64_t block_bytes = kBlockCols * K * ES;
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  const int64_t groups = (M + kMaxRows - 1) / kMaxRows;
  const char* xc = static_cast<const char*>(x);
  // threads share (block, group of rows) units, block by block: where the blocks alone do not divide evenly among
  // the threads (576 outputs are 9 blocks), a block's row groups are split. Each unit runs the tile it would run
  // anyway, so the split changes no output's arithmetic.
  at::parallel_for(0, blocks * groups, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / groups, m = u % groups * kMaxRows, n = b * kBlockCols;
      const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, N - n));
      tile_rows<WT>(std::min<int64_t>(kMaxRows, M - m), xc + m * K * XS, K, packed + b * block_bytes, valid,
                    bias ? bias + n : nullptr, y + m * ldy + n, ldy);
    }
  });
}

#ifdef SPECDEC_AVX512
// x (M, K) float32 -> bfloat16, rounded to nearest even, then `pad` zeros; M * K is a multiple of 16
std::vector<uint16_t> to_bf16(const float* x, int64_t count, int64_t pad = 0) {
  std::vector<uint16_t> out(count + pad, 0);
  for (int64_t e = 0; e < count; e += 16)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.data() + e), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + e)));
  return out;
}
#endif
