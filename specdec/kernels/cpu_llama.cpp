// specdec CPU kernels: a Llama-family forward pass whose results do not depend on batch shape.
//
// Every number is computed in float32 from weights stored in float32, bfloat16 or float16. Each output
// of a matrix product, each attention output and each norm is reduced in one fixed order that depends
// only on that output's own inputs: never on how many tokens are scored together, on which other
// sequences share the pass, or on how work is split among threads. So scoring k drafted tokens in one
// pass gives bit for bit what k one-token passes give, and speculation cannot change a single token.
//
// Reduction order of a matrix product's output: one float32 accumulator, over k = 0..K-1 in increasing order
// with fused multiply-adds (for bfloat16 products: over pairs of k, by vdpbf16ps, or by AMX tiles on CPUs that have
// them, chosen per machine and never per pass). Which of the two a pass uses
// is the caller's choice per pass (the Python side: bfloat16 for a sequence's first pass, or for every pass). Other dot products (norms,
// attention scores) use 16 lanes, lane l accumulating k = l (mod 16), then vec::sum.
//
// Built for AVX-512 where the CPU has it, otherwise for AVX2 (vec16.h carries 16 lanes in two registers there, with
// the same order of operations in every lane). bfloat16 products (vdpbf16ps, AMX) exist in AVX-512 builds only.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include <immintrin.h>
#include <cpuid.h>
#include "vec16.h"
#include <sys/syscall.h>
#include <unistd.h>

namespace {

using vec::f32x16;

#ifdef __AVX512F__
#define SPECDEC_AVX512 1
#endif

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
  const char* xc = static_cast<const char*>(x);
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kBlockCols;
      const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, N - n));
      const char* block = packed + b * block_bytes;
      const float* bn = bias ? bias + n : nullptr;
      for (int64_t m = 0; m < M; m += kMaxRows)
        tile_rows<WT>(std::min<int64_t>(kMaxRows, M - m), xc + m * K * XS, K, block, valid, bn, y + m * ldy + n, ldy);
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

// ---- bfloat16 products on AMX tiles ----------------------------------------------------------------------
// Where the CPU and OS allow it, bfloat16 products (BF16DOT's: x rounded to bfloat16) run on AMX tiles, 16 rows of
// x at a time. TDPBF16PS sums each output over pairs of k into one float32, reading the packed pair layout as it is
// (a block's 16 columns of 16 pairs are one tile, rows 256 bytes apart), at a small fraction of the AVX-512
// products' cost, so a pass over tens of tokens costs little more than reading the weights. Its sums round
// differently from vdpbf16ps's (last bits), so the choice depends only on the machine and K (a multiple of 32), never
// on how many rows are multiplied: passes stay batch-invariant.

#if defined(SPECDEC_AVX512) && !defined(SPECDEC_NO_AMX) && ((defined(__clang__) && __clang_major__ >= 12) || \
                                  (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SPECDEC_AMX 1  // the compiler has the AMX intrinsics
#endif

#ifndef SPECDEC_AMX
bool amx_permitted() { return false; }
#else
bool amx_permitted() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux: ask for the tile data state
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
#endif

bool amx_enabled = true;  // set_amx turns it off, for comparisons with the AVX-512 products

#ifdef SPECDEC_AMX
bool use_amx(int64_t K) { return amx_enabled && K % 32 == 0 && amx_permitted(); }
#endif

// how far ahead of the tiles the weights are fetched into cache (tile loads are not prefetched by the hardware as
// vector loads are); 8 KB measured best on the build machine's two shared cores (4 to 32 KB tried)
constexpr int64_t kPrefetchAhead = 8192;

#ifdef SPECDEC_AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: float32 outputs (16 rows x 16 columns); 4: x (16 rows x 32 k); 5-7: weights (16 pairs x 16 columns)
constexpr TileConfig tile_shapes() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
// a static object: ldtilecfg reads memory the compiler does not know it reads, so a local could be left unwritten
const TileConfig kTileShapes = tile_shapes();

__attribute__((target("amx-tile"))) void amx_start() { _tile_loadconfig(&kTileShapes); }

__attribute__((target("amx-tile"))) void amx_end() { _tile_release(); }

// y rows [0, M), the block's columns [0, valid) = x @ W^T (+ bias); x bfloat16 (M rounded up to 16 rows, zeros).
// end: where the weights this thread multiplies end (its blocks are contiguous), for the prefetches.
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(const uint16_t* x, int64_t M, int64_t K,
                                                           const char* block, const char* end, int valid,
                                                           const float* bias, float* y, int64_t ldy) {
  alignas(64) float out[16 * kBlockCols];
  for (int64_t m = 0; m < M; m += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < K; k += 32) {
      const char* w = block + k * kBlockCols * 2;  // pair k/2 of every column: 256 bytes a pair
      if (m == 0 && w + kPrefetchAhead < end)
        for (int line = 0; line < 32 * kBlockCols * 2; line += 64) _mm_prefetch(w + kPrefetchAhead + line, _MM_HINT_T0);
      _tile_loadd(4, x + m * K + k, K * 2);
      _tile_loadd(5, w, 256);
      _tile_loadd(6, w + 64, 256);
      _tile_loadd(7, w + 128, 256);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, w + 192, 256);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, out, kBlockCols * 4);
    _tile_stored(1, out + 16, kBlockCols * 4);
    _tile_stored(2, out + 32, kBlockCols * 4);
    _tile_stored(3, out + 48, kBlockCols * 4);
    const int64_t rows = std::min<int64_t>(16, M - m);
    for (int v = 0; v < kVecs; ++v) {
      const int live = live_lanes(valid, v);
      if (!live) break;
      const f32x16 b = bias_lanes(bias, v, live);
      for (int64_t r = 0; r < rows; ++r)
        vec::store_first(live, y + (m + r) * ldy + v * 16, vec::add(vec::load(out + r * kBlockCols + v * 16), b));
    }
  }
}

// linear_blocks<BF16DOT> on AMX tiles: y (M, ldy) columns [0, N) = bfloat16(x) (M, K) @ W^T (+ bias);
// W bfloat16 packed in pairs, K a multiple of 32
void linear_amx(const float* x, int64_t M, const char* packed, int64_t N, int64_t K, const float* bias, float* y,
                int64_t ldy) {
  const std::vector<uint16_t> xb = to_bf16(x, M * K, (-M & 15) * K);  // zero rows up to a multiple of 16
  const int64_t block_bytes = kBlockCols * K * 2;
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    amx_start();
    const char* first = packed + b0 * block_bytes;  // the blocks' loads prefetch what follows them, not themselves
    for (int64_t line = 0; line < std::min(kPrefetchAhead, (b1 - b0) * block_bytes); line += 64)
      _mm_prefetch(first + line, _MM_HINT_T0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kBlockCols;
      const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, N - n));
      amx_block(xb.data(), M, K, packed + b * block_bytes, packed + b1 * block_bytes, valid,
                bias ? bias + n : nullptr, y + n, ldy);
    }
    amx_end();
  });
}
#endif  // SPECDEC_AMX

// (N, K) row-major -> packed blocks of 64 rows (see kBlockCols), as a flat tensor of the same dtype
torch::Tensor pack_blocks(const torch::Tensor& w, bool pairs) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  torch::Tensor padded = torch::zeros({blocks * kBlockCols, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  if (pairs)  // (blocks, 64, K/2, 2) -> (blocks, K/2, 64, 2)
    return padded.view({blocks, kBlockCols, K / 2, 2}).permute({0, 2, 1, 3}).contiguous().view({-1});
#ifdef SPECDEC_AVX512
  // (blocks, 64, K) -> (blocks, K, 64)
  return padded.view({blocks, kBlockCols, K}).permute({0, 2, 1}).contiguous().view({-1});
#else
  // (blocks, 64, K) -> (blocks, 4, K, 16)
  return padded.view({blocks, kVecs, 16, K}).permute({0, 1, 3, 2}).contiguous().view({-1});
#endif
}

struct Weight {
  torch::Tensor tensor;  // packed blocks, kept alive here
  const char* data = nullptr;
  int64_t N = 0, K = 0;
  int wtype = F32;  // the stored type: F32, BF16 or F16
  bool pairs = false;  // bfloat16 packed in pairs of k: products in float32 (BF16PAIRS) or bfloat16 (BF16DOT)
};

// pairs: pack bfloat16 weights for both kinds of product (a no-op for other dtypes)
Weight make_weight(const torch::Tensor& t, bool pairs = false) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.device().is_cpu(), "weights must be contiguous 2-D CPU tensors");
  TORCH_CHECK(t.size(1) % 16 == 0, "the kernels need inner sizes that are multiples of 16");
  Weight w;
  w.N = t.size(0);
  w.K = t.size(1);
  if (t.scalar_type() == torch::kFloat32) w.wtype = F32;
  else if (t.scalar_type() == torch::kBFloat16) w.wtype = BF16;
  else if (t.scalar_type() == torch::kFloat16) w.wtype = F16;
  else TORCH_CHECK(false, "weights must be float32, bfloat16 or float16");
#ifndef SPECDEC_AVX512
  TORCH_CHECK(!pairs, "weights packed in pairs (bfloat16 products) need an AVX-512 build of the kernels");
#endif
  w.pairs = pairs && w.wtype == BF16;
  w.tensor = pack_blocks(t, w.pairs);
  w.data = static_cast<const char*>(w.tensor.data_ptr());
  return w;
}

// y (M, ldy) columns [0, N) = x (M, K) @ w^T (+ bias), x float32; bf16_products: round x to bfloat16 and
// multiply in pairs (only for weights packed in pairs)
void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y, int64_t ldy,
            bool bf16_products = false) {
  TORCH_CHECK(!bf16_products || w.pairs, "bfloat16 products need bfloat16 weights packed in pairs");
#ifdef SPECDEC_AVX512
  if (w.pairs) {
#ifdef SPECDEC_AMX
    if (bf16_products && use_amx(w.K)) {
      linear_amx(x, M, w.data, w.N, w.K, bias, y, ldy);
      return;
    }
#endif
    if (bf16_products) {
      const std::vector<uint16_t> xb = to_bf16(x, M * w.K);  // activations rounded once per product
      linear_blocks<BF16DOT>(xb.data(), M, w.data, w.N, w.K, bias, y, ldy);
    } else {
      linear_blocks<BF16PAIRS>(x, M, w.data, w.N, w.K, bias, y, ldy);
    }
    return;
  }
#endif
  switch (w.wtype) {
    case BF16: linear_blocks<BF16>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
    case F16: linear_blocks<F16>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
    default: linear_blocks<F32>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
  }
}

// n is a multiple of 16
inline float dot(const float* a, const float* b, int64_t n) {
  f32x16 acc = vec::zero();
  for (int64_t k = 0; k < n; k += 16) acc = vec::fmadd(vec::load(a + k), vec::load(b + k), acc);
  return vec::sum(acc);
}

// e^x for 16 lanes (Cody-Waite reduction, degree-6 polynomial; within 2 ulp for x in [-87, 88]).
inline f32x16 exp16(f32x16 x) {
  using namespace vec;
  x = max(min(x, set1(88.3762626647949f)), set1(-103.972084045410f));
  const f32x16 n = round_even(mul(x, set1(1.44269504088896341f)));
  f32x16 r = fnmadd(n, set1(0.693359375f), x);
  r = fnmadd(n, set1(-2.12194440e-4f), r);
  f32x16 p = set1(1.9875691500E-4f);
  p = fmadd(p, r, set1(1.3981999507E-3f));
  p = fmadd(p, r, set1(8.3334519073E-3f));
  p = fmadd(p, r, set1(4.1665795894E-2f));
  p = fmadd(p, r, set1(1.6666665459E-1f));
  p = fmadd(p, r, set1(5.0000001201E-1f));
  p = fmadd(p, mul(r, r), add(r, set1(1.0f)));
  return scale2(p, n);
}

// rows per task when row-wise work is split among threads (a row's result never depends on the split)
constexpr int64_t kRowGrain = 32;

// x (M, H) -> out (M, H): out = weight * (x / sqrt(mean(x^2) + eps))
void rms_norm(const float* x, int64_t M, int64_t H, const float* weight, float eps, float* out) {
  at::parallel_for(0, M, kRowGrain, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const float* xr = x + m * H;
      const float inv = 1.0f / std::sqrt(dot(xr, xr, H) / static_cast<float>(H) + eps);
      float* o = out + m * H;
      for (int64_t h = 0; h < H; ++h) o[h] = weight[h] * (xr[h] * inv);
    }
  });
}

// Attention scores of R query rows against blocks of 16 cached keys ([blocks][hd][16]): scores[r * width + j] =
// scale * sum over d in increasing order of q[r][d] k_j[d]. R is a template argument so the accumulators stay in
// registers.
template <int R>
void score_block_rows(const float* const* q, const float* kbase, int64_t hd, int64_t blocks, float scale,
                      float* scores, int64_t width) {
  for (int64_t b = 0; b < blocks; ++b) {
    const float* kb = kbase + b * hd * 16;
    f32x16 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) acc[r] = vec::zero();
    for (int64_t d = 0; d < hd; ++d) {
      const f32x16 kv = vec::load(kb + d * 16);
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

template <int R = kScoreRows>
void score_rows(int64_t rows, const float* const* q, const float* kbase, int64_t hd, int64_t blocks, float scale,
                float* scores, int64_t width) {
  if (rows > kScoreRows) {  // each row's scores are its own: splitting the rows changes nothing in them
    score_rows(kScoreRows, q, kbase, hd, blocks, scale, scores, width);
    return score_rows(rows - kScoreRows, q + kScoreRows, kbase, hd, blocks, scale, scores + kScoreRows * width, width);
  }
  if constexpr (R > 0) {
    if (rows == R) return score_block_rows<R>(q, kbase, hd, blocks, scale, scores, width);
    score_rows<R - 1>(rows, q, kbase, hd, blocks, scale, scores, width);
  }
}

// Value sums of R attention rows over consecutive keys [i0, i1): acc_r[d] += w_r[i] v[i][d], i in increasing order,
// for DV vectors of 16 lanes of d (v rows of hd floats). The rows share every load of v; each row's sum is the
// same chain of fused multiply-adds as if it ran alone, so a row's result does not depend on its neighbours.
template <int R, int DV>
void accumulate_rows(const float* const* w, int64_t i0, int64_t i1, const float* v, int64_t hd, float* const* acc) {
  f32x16 a[R][DV];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < DV; ++j) a[r][j] = vec::load(acc[r] + j * 16);
  for (int64_t i = i0; i < i1; ++i) {
    const float* row = v + i * hd;
    f32x16 vv[DV];
#pragma GCC unroll 16
    for (int j = 0; j < DV; ++j) vv[j] = vec::load(row + j * 16);
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
#else
constexpr int rows_per_pass(int dv) { return dv <= 2 ? 2 : 1; }
#endif

template <int DV>
void accumulate_some(int64_t rows, const float* const* w, int64_t i0, int64_t i1, const float* v, int64_t hd,
                     float* const* acc) {
  constexpr int R = rows_per_pass(DV);
  int64_t r = 0;
  for (; r + R <= rows; r += R) accumulate_rows<R, DV>(w + r, i0, i1, v, hd, acc + r);
  for (; r < rows; ++r) accumulate_rows<1, DV>(w + r, i0, i1, v, hd, acc + r);
}

template <int DV = 16>
void accumulate(int64_t dv, int64_t rows, const float* const* w, int64_t i0, int64_t i1, const float* v, int64_t hd,
                float* const* acc) {
  if constexpr (DV > 0) {
    if (dv == DV) return accumulate_some<DV>(rows, w, i0, i1, v, hd, acc);
    accumulate<DV - 1>(dv, rows, w, i0, i1, v, hd, acc);
  }
}

// RoPE (rotate-half form) on `heads` consecutive vectors of hd floats, one row's angles cr = cos, sr = sin (hd,)
void rope_heads(float* row, int64_t heads, int64_t hd, const float* cr, const float* sr) {
  const int64_t half = hd / 2;
  for (int64_t head = 0; head < heads; ++head) {
    float* v = row + head * hd;
    float rotated[256];
    for (int64_t d = 0; d < half; ++d) {
      rotated[d] = v[d] * cr[d] + (-v[d + half]) * sr[d];
      rotated[d + half] = v[d + half] * cr[d + half] + v[d] * sr[d + half];
    }
    std::copy(rotated, rotated + hd, v);
  }
}

// gu (M, 2I): gate then up for each row -> act (M, I) = silu(gate) * up; I a multiple of 16
void swiglu(const float* gu, int64_t M, int64_t I, float* act) {
  at::parallel_for(0, M, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t e = 0; e < I; e += 16) {
        const f32x16 g = vec::load(gu + i * 2 * I + e);
        const f32x16 silu = vec::div(g, vec::add(vec::set1(1.0f), exp16(vec::sub(vec::zero(), g))));
        vec::store(act + i * I + e, vec::mul(silu, vec::load(gu + i * 2 * I + I + e)));
      }
  });
}

struct Config {
  int64_t hidden, heads, kv_heads, head_dim, intermediate, layers, vocab;
  float eps;
};

struct Layer {
  torch::Tensor input_norm, post_norm;  // float32 (H,)
  Weight qkv, o, gate_up, down;
  torch::Tensor qkv_bias, o_bias;  // float32 or undefined
};

class CpuLlama {
 public:
  CpuLlama(std::vector<int64_t> dims, double eps, std::vector<torch::Tensor> layer_tensors, torch::Tensor embed,
           torch::Tensor final_norm, torch::Tensor lm_head, torch::Tensor cos, torch::Tensor sin, bool pairs) {
    TORCH_CHECK(dims.size() == 7, "dims: hidden, heads, kv_heads, head_dim, intermediate, layers, vocab");
    cfg_ = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], static_cast<float>(eps)};
    TORCH_CHECK(cfg_.head_dim % 16 == 0 && cfg_.head_dim <= 256, "head_dim must be a multiple of 16, at most 256");
    TORCH_CHECK(cfg_.hidden % 16 == 0, "hidden size must be a multiple of 16");
    TORCH_CHECK(static_cast<int64_t>(layer_tensors.size()) == 8 * cfg_.layers, "8 tensors per layer");
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      const torch::Tensor* t = &layer_tensors[8 * l];
      Layer layer;
      layer.input_norm = t[0].contiguous().to(torch::kFloat32);
      layer.qkv = make_weight(t[1], pairs);
      layer.qkv_bias = t[2].defined() && t[2].numel() ? t[2].contiguous().to(torch::kFloat32) : torch::Tensor();
      layer.o = make_weight(t[3], pairs);
      layer.o_bias = t[4].defined() && t[4].numel() ? t[4].contiguous().to(torch::kFloat32) : torch::Tensor();
      layer.post_norm = t[5].contiguous().to(torch::kFloat32);
      layer.gate_up = make_weight(t[6], pairs);
      layer.down = make_weight(t[7], pairs);
      layers_.push_back(layer);
    }
    embed_rows_ = embed.contiguous();
    embed_type_ = make_weight(embed.narrow(0, 0, 1).contiguous()).wtype;
    lm_head_ = make_weight(lm_head, pairs);
    final_norm_ = final_norm.contiguous().to(torch::kFloat32);
    cos_ = cos.contiguous().to(torch::kFloat32);
    sin_ = sin.contiguous().to(torch::kFloat32);
  }

  // ids (N,) int64: the new tokens of S sequences, concatenated; offsets (S+1,): sequence s owns tokens
  // [offsets[s], offsets[s+1]); slots (S,), starts (S,): its cache slot and cached length; positions (N,):
  // RoPE positions; masks: (S, T, T) uint8 with T = the longest sequence's new tokens (row t: which new
  // tokens token t sees), or an empty tensor for causal order; k_cache, v_cache: float32 (L, slots, kv_heads,
  // P, head_dim), written at starts[s] + t, where within one (layer, slot, head) the keys are stored in blocks of
  // 16 positions as [P/16][head_dim][16] and the values as [P][head_dim]; logit_rows (R,) int64: rows of the output that get logits.
  // num_layers > 0 runs only the first num_layers layers (an early exit, for self-speculation).
  // bf16_products: every matrix product of this pass in bfloat16 (weights packed in pairs only).
  // aux_layers (A,) int64: layers whose input (the residual stream before layer i, transformers'
  // hidden_states[i]) is returned too, for heads that read several depths (EAGLE-3); may be empty.
  // Returns (logits (R, V), hidden (N, H) after the final norm, aux (N, A * H)).
  std::vector<torch::Tensor> forward(torch::Tensor ids, torch::Tensor offsets, torch::Tensor slots,
                                     torch::Tensor starts, torch::Tensor positions, torch::Tensor masks,
                                     torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor logit_rows,
                                     int64_t num_layers, bool bf16_products, torch::Tensor aux_layers) {
    const auto& c = cfg_;
    const int64_t N = ids.size(0), H = c.hidden, nh = c.heads, nkv = c.kv_heads, hd = c.head_dim;
    const int64_t I = c.intermediate, S = offsets.size(0) - 1;
    const int64_t qkv_width = (nh + 2 * nkv) * hd;
    TORCH_CHECK(k_cache.scalar_type() == torch::kFloat32 && k_cache.is_contiguous(), "k_cache: float32, contiguous");
    TORCH_CHECK(k_cache.size(3) % 16 == 0, "cache capacity must be a multiple of 16");
    TORCH_CHECK(v_cache.scalar_type() == torch::kFloat32 && v_cache.is_contiguous(), "v_cache: float32, contiguous");
    const int64_t P = k_cache.size(3);
    const int64_t slot_count = k_cache.size(1);
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* off = offsets.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t* start = starts.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const bool causal = masks.numel() == 0;
    const int64_t T = causal ? 0 : masks.size(1);
    const uint8_t* mask = causal ? nullptr : masks.data_ptr<uint8_t>();
    for (int64_t s = 0; s < S; ++s)
      TORCH_CHECK(start[s] + (off[s + 1] - off[s]) <= P, "sequence exceeds the KV cache capacity");

    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor x_t = torch::empty({N, H}, f32), h_t = torch::empty({N, H}, f32);
    torch::Tensor qkv_t = torch::empty({N, qkv_width}, f32), attn_t = torch::empty({N, nh * hd}, f32);
    torch::Tensor gu_t = torch::empty({N, 2 * I}, f32), act_t = torch::empty({N, I}, f32);
    float *x = x_t.data_ptr<float>(), *h = h_t.data_ptr<float>(), *qkv = qkv_t.data_ptr<float>();
    float *attn = attn_t.data_ptr<float>(), *gu = gu_t.data_ptr<float>(), *act = act_t.data_ptr<float>();
    const float* cos = cos_.data_ptr<float>();
    const float* sin = sin_.data_ptr<float>();

    // token -> sequence
    std::vector<int64_t> seq_of(N);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = off[s]; i < off[s + 1]; ++i) seq_of[i] = s;

    // embeddings, widened to float32
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(id[i] >= 0 && id[i] < embed_rows_.size(0), "token id out of range");
      const char* row = static_cast<const char*>(embed_rows_.data_ptr()) + id[i] * H * elem_size(embed_type_);
      for (int64_t k = 0; k < H; k += 16) vec::store(x + i * H + k, load16_any(row, k, embed_type_));
    }

    const int64_t layer_stride = slot_count * nkv * P * hd;
    const int64_t depth = num_layers > 0 ? std::min(num_layers, c.layers) : c.layers;
    const int64_t A = aux_layers.numel();
    const int64_t* aux_at = A ? aux_layers.data_ptr<int64_t>() : nullptr;
    for (int64_t j = 0; j < A; ++j)
      TORCH_CHECK(aux_at[j] >= 0 && aux_at[j] < depth, "aux layer out of range");
    torch::Tensor aux_t = torch::empty({N, A * H}, f32);
    float* aux = aux_t.data_ptr<float>();
    for (int64_t l = 0; l < depth; ++l) {
      const Layer& L = layers_[l];
      for (int64_t j = 0; j < A; ++j)
        if (aux_at[j] == l)
          for (int64_t i = 0; i < N; ++i) std::copy(x + i * H, x + (i + 1) * H, aux + (i * A + j) * H);
      float* kc = k_cache.data_ptr<float>() + l * layer_stride;
      float* vc = v_cache.data_ptr<float>() + l * layer_stride;
      rms_norm(x, N, H, L.input_norm.data_ptr<float>(), c.eps, h);
      linear(h, N, L.qkv, L.qkv_bias.defined() ? L.qkv_bias.data_ptr<float>() : nullptr, qkv, qkv_width, bf16_products);
      // RoPE on q and k, then k and v into the cache (each row writes its own cache entries)
      at::parallel_for(0, N, kRowGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* row = qkv + i * qkv_width;
        rope_heads(row, nh + nkv, hd, cos + pos[i] * hd, sin + pos[i] * hd);
        const int64_t s = seq_of[i];
        const int64_t at = start[s] + (i - off[s]);
        for (int64_t g = 0; g < nkv; ++g) {
          // keys: blocks of 16 positions, transposed: [P/16][hd][16]
          float* kb = kc + (slot[s] * nkv + g) * P * hd + (at / 16) * hd * 16 + at % 16;
          const float* src = row + (nh + g) * hd;
          for (int64_t d = 0; d < hd; ++d) kb[d * 16] = src[d];
          std::copy(row + (nh + nkv + g) * hd, row + (nh + nkv + g + 1) * hd, vc + ((slot[s] * nkv + g) * P + at) * hd);
        }
      }
      });
      attention(qkv, qkv_width, kc, vc, P, S, off, slot, start, causal, T, mask, attn);
      linear(attn, N, L.o, L.o_bias.defined() ? L.o_bias.data_ptr<float>() : nullptr, h, H, bf16_products);
      for (int64_t e = 0; e < N * H; ++e) x[e] += h[e];
      rms_norm(x, N, H, L.post_norm.data_ptr<float>(), c.eps, h);
      linear(h, N, L.gate_up, nullptr, gu, 2 * I, bf16_products);
      swiglu(gu, N, I, act);
      linear(act, N, L.down, nullptr, h, H, bf16_products);
      for (int64_t e = 0; e < N * H; ++e) x[e] += h[e];
    }
    rms_norm(x, N, H, final_norm_.data_ptr<float>(), c.eps, h);
    const int64_t R = logit_rows.size(0);
    const int64_t* rows = logit_rows.data_ptr<int64_t>();
    torch::Tensor picked = torch::empty({R, H}, f32);
    for (int64_t r = 0; r < R; ++r) std::copy(h + rows[r] * H, h + (rows[r] + 1) * H, picked.data_ptr<float>() + r * H);
    torch::Tensor logits = torch::empty({R, lm_head_.N}, f32);
    linear(picked.data_ptr<float>(), R, lm_head_, nullptr, logits.data_ptr<float>(), lm_head_.N, bf16_products);
    return {logits, h_t, aux_t};
  }

  // Attention of every new token, per sequence s and KV head g: the rows are (token t, head h of group g).
  // Row (t, h) sees keys [0, start_s) and the new tokens its mask allows (causal: u <= t). Scores come in
  // blocks of 16 keys, score = sum over d in increasing order of q[d] k[d]; the softmax sum and the
  // weighted sum of values run over the visible keys in increasing order.
  void attention(const float* qkv, int64_t qkv_width, const float* kc, const float* vc, int64_t P, int64_t S,
                 const int64_t* off, const int64_t* slot, const int64_t* start, bool causal, int64_t T,
                 const uint8_t* mask, float* out) const {
    const int64_t nh = cfg_.heads, nkv = cfg_.kv_heads, hd = cfg_.head_dim, groups = nh / nkv;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
    // tasks: (sequence, KV head, chunk of query rows); a chunk shares every key load among its rows
    int64_t total_rows = 0;
    for (int64_t s = 0; s < S; ++s) total_rows += (off[s + 1] - off[s]) * groups * nkv;
    const int64_t chunk = total_rows >= 48 ? 8 : 1;
    std::vector<std::array<int64_t, 4>> tasks;  // s, g, first row, row count
    for (int64_t s = 0; s < S; ++s)
      for (int64_t g = 0; g < nkv; ++g) {
        const int64_t rows = (off[s + 1] - off[s]) * groups;
        for (int64_t r = 0; r < rows; r += chunk) tasks.push_back({s, g, r, std::min(chunk, rows - r)});
      }
    at::parallel_for(0, static_cast<int64_t>(tasks.size()), 1, [&](int64_t w0, int64_t w1) {
      std::vector<float> scores, weights, acc;
      std::vector<int64_t> tail_keys;
      int64_t contig[8], count[8];
      float inv_totals[8];
      const float* wptr[8];
      float* aptr[8];
      for (int64_t w = w0; w < w1; ++w) {
        const int64_t s = tasks[w][0], g = tasks[w][1], first = tasks[w][2], rows = tasks[w][3];
        const int64_t Ts = off[s + 1] - off[s], base = start[s];
        // causal rows see no key past their own token: score only the blocks up to the chunk's last row
        const int64_t keys = causal ? base + (first + rows - 1) / groups + 1 : base + Ts;
        const int64_t blocks = (keys + 15) / 16, width = blocks * 16;
        scores.assign(rows * width, 0.0f);
        const float* kbase = kc + (slot[s] * nkv + g) * P * hd;
        const float* vbase = vc + (slot[s] * nkv + g) * P * hd;
        const float* q[8];
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = first + r;
          q[r] = qkv + (off[s] + row / groups) * qkv_width + (g * groups + row % groups) * hd;
        }
        score_rows(rows, q, kbase, hd, blocks, scale, scores.data(), width);
        // Each row sees keys [0, base) and the new tokens its mask allows, in increasing order: the first
        // `contig[r]` of them are keys 0, 1, ... (all of them for causal rows), the rest are listed in tail_keys.
        const int64_t stride = (base + Ts + 15) / 16 * 16;
        weights.assign(rows * stride, 0.0f);
        tail_keys.assign(rows * Ts, 0);
        acc.assign(rows * hd, 0.0f);
        int64_t shared = base + Ts;
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t row = first + r, t = row / groups;
          const float* sc = &scores[r * width];
          int64_t n = base, tails = 0;
          for (int64_t u = 0; u < Ts; ++u)
            if (causal ? u <= t : mask[(s * T + t) * T + u] != 0) {
              if (tails == 0 && base + u == n) ++n;  // still consecutive
              else tail_keys[r * Ts + tails++] = base + u;
            }
          contig[r] = n;
          count[r] = n + tails;
          shared = std::min(shared, n);
          // Softmax over the visible keys in increasing order: a token's attention depends on which keys it
          // sees, never on where they sit in the cache (a tree node and its compacted path agree bit for bit).
          const int64_t* tk = &tail_keys[r * Ts];
          float top = -INFINITY;
          for (int64_t i = 0; i < n; ++i) top = std::max(top, sc[i]);
          for (int64_t i = 0; i < tails; ++i) top = std::max(top, sc[tk[i]]);
          float* wr = &weights[r * stride];
          for (int64_t i = 0; i < n; ++i) wr[i] = sc[i] - top;
          for (int64_t i = 0; i < tails; ++i) wr[n + i] = sc[tk[i]] - top;
          const int64_t all = count[r], padded = (all + 15) / 16 * 16;
          f32x16 total = vec::zero();
          for (int64_t i = 0; i < padded; i += 16) {
            const f32x16 e = vec::keep_first(static_cast<int>(std::min<int64_t>(all - i, 16)), exp16(vec::load(wr + i)));
            vec::store(wr + i, e);
            total = vec::add(total, e);
          }
          inv_totals[r] = 1.0f / vec::sum(total);
          wptr[r] = wr;
          aptr[r] = &acc[r * hd];
        }
        // value sums: the keys every row sees together (sharing each load of v), then each row's own
        accumulate(hd / 16, rows, wptr, 0, shared, vbase, hd, aptr);
        for (int64_t r = 0; r < rows; ++r) {
          accumulate(hd / 16, 1, wptr + r, shared, contig[r], vbase, hd, aptr + r);
          const float* wr = wptr[r];
          float* a = aptr[r];
          for (int64_t i = contig[r]; i < count[r]; ++i) {
            const f32x16 wi = vec::set1(wr[i]);
            const float* vrow = vbase + tail_keys[r * Ts + (i - contig[r])] * hd;
            for (int64_t d = 0; d < hd; d += 16) vec::store(a + d, vec::fmadd(wi, vec::load(vrow + d), vec::load(a + d)));
          }
          const int64_t row = first + r, t = row / groups;
          float* o = out + (off[s] + t) * nh * hd + (g * groups + row % groups) * hd;
          const f32x16 inv_total = vec::set1(inv_totals[r]);
          for (int64_t d = 0; d < hd; d += 16) vec::store(o + d, vec::mul(vec::load(a + d), inv_total));
        }
      }
    });
  }

  // Moves cache entries start + keep[i] to start + i in one slot (tree path compaction), all layers and heads.
  void compact(torch::Tensor k_cache, torch::Tensor v_cache, int64_t slot, int64_t start, std::vector<int64_t> keep) {
    const int64_t L = k_cache.size(0), slots = k_cache.size(1), nkv = cfg_.kv_heads, hd = cfg_.head_dim;
    const int64_t P = k_cache.size(3);
    float* kc = k_cache.data_ptr<float>();
    float* vc = v_cache.data_ptr<float>();
    for (int64_t l = 0; l < L; ++l)
      for (int64_t g = 0; g < nkv; ++g) {
        const int64_t head = ((l * slots + slot) * nkv + g) * P * hd;
        for (size_t i = 0; i < keep.size(); ++i) {
          const int64_t from = start + keep[i], to = start + static_cast<int64_t>(i);
          if (from == to) continue;
          for (int64_t d = 0; d < hd; ++d)
            kc[head + (to / 16) * hd * 16 + d * 16 + to % 16] = kc[head + (from / 16) * hd * 16 + d * 16 + from % 16];
          std::copy(vc + head + from * hd, vc + head + (from + 1) * hd, vc + head + to * hd);
        }
      }
  }

  // y = x @ w^T with the same kernel (for drafter heads and tests): x (M, K) float32, w (N, K).
  static torch::Tensor matmul(torch::Tensor x, torch::Tensor w) {
    x = x.contiguous().to(torch::kFloat32);
    Weight weight = make_weight(w.contiguous());
    TORCH_CHECK(x.size(1) == weight.K, "inner sizes differ");
    torch::Tensor y = torch::empty({x.size(0), weight.N}, torch::TensorOptions().dtype(torch::kFloat32));
    linear(x.data_ptr<float>(), x.size(0), weight, nullptr, y.data_ptr<float>(), weight.N);
    return y;
  }

 private:
  Config cfg_;
  std::vector<Layer> layers_;
  torch::Tensor embed_rows_;  // (V, H) as given, for lookups
  int embed_type_ = F32;
  Weight lm_head_;
  torch::Tensor final_norm_, cos_, sin_;
};

// A weight packed once for the kernels; y = x @ w^T (+ bias) in float32, with the same reduction order as
// the model's own products (batch-invariant).
class PackedLinear {
 public:
  PackedLinear(torch::Tensor weight, torch::Tensor bias, bool bf16_dot)
      : weight_(make_weight(weight.contiguous(), bf16_dot)), bf16_dot_(bf16_dot && weight_.pairs) {
    if (bias.defined() && bias.numel()) bias_ = bias.contiguous().to(torch::kFloat32);
  }
  torch::Tensor call(torch::Tensor x) const {
    TORCH_CHECK(x.dim() == 2 && x.size(1) == weight_.K, "x must be (M, in_features)");
    x = x.contiguous().to(torch::kFloat32);
    torch::Tensor y = torch::empty({x.size(0), weight_.N}, torch::TensorOptions().dtype(torch::kFloat32));
    linear(x.data_ptr<float>(), x.size(0), weight_, bias_.defined() ? bias_.data_ptr<float>() : nullptr,
           y.data_ptr<float>(), weight_.N, bf16_dot_);
    return y;
  }
  int64_t out_features() const { return weight_.N; }
  int64_t in_features() const { return weight_.K; }

 private:
  Weight weight_;
  bool bf16_dot_;
  torch::Tensor bias_;
};

#include "head_layer.h"

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  // module_local: an AVX2 and an AVX-512 build may share one process (tests compare them)
  pybind11::class_<CpuLlama>(m, "CpuLlama", pybind11::module_local())
      .def(pybind11::init<std::vector<int64_t>, double, std::vector<torch::Tensor>, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, bool>())
      .def("forward", &CpuLlama::forward, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("compact", &CpuLlama::compact)
      .def_static("matmul", &CpuLlama::matmul);
  m.def("amx_available", [] { return amx_permitted(); }, "bfloat16 products run on AMX tiles where allowed");
  m.def("set_amx", [](bool on) { const bool was = amx_enabled; amx_enabled = on; return was; },
        "turns the AMX products on or off (for comparisons); returns the previous setting");
  pybind11::class_<PackedLinear>(m, "PackedLinear", pybind11::module_local())
      .def(pybind11::init<torch::Tensor, torch::Tensor, bool>(), pybind11::arg("weight"), pybind11::arg("bias"),
           pybind11::arg("bf16_dot"))
      .def("__call__", &PackedLinear::call, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def_property_readonly("out_features", &PackedLinear::out_features)
      .def_property_readonly("in_features", &PackedLinear::in_features);
  pybind11::class_<HeadLayer>(m, "HeadLayer", pybind11::module_local())
      .def(pybind11::init<std::vector<int64_t>, double, torch::Tensor, torch::Tensor, torch::Tensor, torch::Tensor,
                          torch::Tensor, torch::Tensor, torch::Tensor, bool>())
      .def("forward", &HeadLayer::forward, pybind11::call_guard<pybind11::gil_scoped_release>());
}
