// Quantized weights' products, in groups of 32 weights of an output row (quantized_layout.h's formats): activations
// rounded to int8 per group (int8_lanes.h), integer sums of codes times them per group, then the format's float32
// steps (quantized_steps.h). The tile for one row (decoding and drafting steps; several rows on AVX-512 builds) and
// the sharing of a product among threads; several rows on AVX2 go to quantized_rows.h's tile. Part of
// cpu_llama.cpp's translation unit, included after quantized_rows.h.
#pragma once

// K6's half-group that starts at activation k ends: each row's sums lose its offset (k6_half_offset)
template <int MR, int NV, int FMT>
inline __attribute__((always_inline)) void half_offsets(const Q8Rows& x, int64_t row0, int64_t K, int64_t k,
                                                        qv::i32x16 (&isum)[MR][NV]) {
  for (int j = 0; j < MR; ++j) {
    const qv::i32x16 offset = k6_half_offset<FMT>(x.q.data() + (row0 + j) * K + k);
    for (int v = 0; v < NV; ++v) isum[j][v] = less_offset<FMT>(isum[j][v], offset);
  }
}

// Two or three rows on AVX2 builds take this tile a stream (NV 2) at a time, one pass a group for both of its
// vectors, where the tile of quantized_rows.h reads a 4-bit stream twice, once a nibble (it keeps four rows' sums
// in registers, and four rows here ran 3-8% slower, 5-53% at eight). Arithmetic this light leaves the hardware's
// prefetchers behind: two rows of Q4_1 8,192 x 2,048 from memory cost the sum of their reads and their arithmetic
// in cache. So 4-bit streams are fetched kAheadChunks groups ahead. Against the tile of quantized_rows.h, products
// from memory on Zen 3 ran 10-25% faster at two rows and 20-27% at three, every format; one row's tile ran 2-56%
// slower with the same fetches (its own reads keep the memory busy), and 8-bit streams (four a block) gained
// nothing from them.
constexpr int64_t kAheadChunks = 4;

template <int MR, int FMT>
constexpr bool fetch_ahead() {
#ifdef SPECDEC_AVX512
  return false;
#else
  return (MR == 2 || MR == 3) && q_bits(FMT) == 4;
#endif
}

// A stream's group (chunk) fetched into L1, as the tile reads it kAheadChunks groups later
template <int FMT>
inline __attribute__((always_inline)) void prefetch_chunk(const uint8_t* chunk) {
#pragma GCC unroll 12
  for (int64_t line = 0; line < QLayout<FMT>::kChunkBytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(chunk + line), _MM_HINT_T0);
}

// The outputs of the block's vectors [v0, v0 + NV) (NV of 2 or 4 vectors of 16 columns, v0 even) for MR rows of x
// (quantized): per group, integer sums of the stored integers times x's, then acc += (d * scale_x) * sum (+ m *
// sum_x where the format has a minimum), in the format's float32 steps (QFormat). 8-bit codes are signed: |w|
// (unsigned) times x with w's sign, so that q = -128 (Q8_0 allows it) is exact too; K6's are taken unsigned, less an
// offset at each half-group's end (k6_half_offset). K6's two halves of a group have their own sc: their sums are
// scaled in int32 (exact: |sum| < 2^16, |sc| <= 128) and added before the one conversion to float (exact below 2^24).
template <int MR, int FMT, int NV>
__attribute__((noinline)) void tile_quantized(const Q8Rows& x, int64_t row0, int64_t K,
                                              const uint8_t* __restrict block, int v0, int valid,
                                              const float* __restrict bias, float* __restrict y, int64_t ldy) {
#ifndef SPECDEC_AVX512
  if constexpr (MR > 3) {
    return tile_quantized_by_vector<MR, FMT, NV>(x, row0, K, block, v0, valid, bias, y, ldy);
  } else if constexpr (MR > 1 && NV == 4) {
    tile_quantized<MR, FMT, 2>(x, row0, K, block, v0, valid, bias, y, ldy);
    if (live_lanes(valid, v0 + 2)) tile_quantized<MR, FMT, 2>(x, row0, K, block, v0 + 2, valid, bias, y, ldy);
    return;
  }
#endif
  using L = QLayout<FMT>;
  const int64_t G = K / kQGroup;
  f32x16 acc[MR][NV];
  for (int j = 0; j < MR; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = vec::zero();
  f32x16 super_d[kVecs], super_m[kVecs];
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* units[kVecs];  // the units of the vectors [v0, v0 + NV): one per two vectors at 4 bits
    for (int u = 0; u < (L::kBits == 4 ? NV / 2 : NV); ++u)
      units[u] = block + L::unit(g, 0, (L::kBits == 4 ? v0 / 2 : v0) + u, G);
    if constexpr (fetch_ahead<MR, FMT>())
      for (int u = 0; u < NV / 2; ++u) prefetch_chunk<FMT>(units[u] + kAheadChunks * L::kChunkBytes);
    qv::i32x16 isum[MR][NV], half_sum[MR][NV];
    for (int j = 0; j < MR; ++j)
      for (int v = 0; v < NV; ++v) isum[j][v] = qv::zero(), half_sum[j][v] = qv::zero();
#pragma GCC unroll 8
    for (int quad = 0; quad < kQGroup / 4; ++quad) {
      for (int j = 0; j < MR; ++j)
        for (int v = 0; v < NV; ++v) k5_middle<FMT>(quad, isum[j][v], half_sum[j][v]);
      if constexpr (FMT == K6) {
        if (quad == kQGroup / 8) {
          half_offsets<MR, NV, FMT>(x, row0, K, g * kQGroup, isum);
          for (int v = 0; v < NV; ++v) {
            const qv::i32x16 sc = qv::widen_s8(block + L::d(g, v0 + v, G));
            for (int j = 0; j < MR; ++j) half_sum[j][v] = close_first_half<FMT>(isum[j][v], sc);
          }
        }
      }
      qv::i32x16 w[NV];
      if constexpr (L::kBits == 4) {
#pragma GCC unroll 2
        for (int u = 0; u < NV / 2; ++u) {
          const uint8_t* at = units[u] + quad * L::kQuadStep;
          const qv::i32x16 both = qv::load(at);
          w[2 * u] = vector_codes<FMT, false>(at, both);
          w[2 * u + 1] = vector_codes<FMT, true>(at, both);
        }
      } else {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) w[v] = qv::load(units[v] + quad * L::kQuadStep);
      }
#pragma GCC unroll 4
      for (int j = 0; j < MR; ++j) {
        const qv::i32x16 xb = qv::broadcast4(x.q.data() + (row0 + j) * K + g * kQGroup + quad * 4);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          isum[j][v] = add_quad<FMT>(isum[j][v], w[v], xb);
          qv::pin(isum[j][v]);
        }
      }
    }
    if constexpr (FMT == K6) half_offsets<MR, NV, FMT>(x, row0, K, g * kQGroup + kQGroup / 2, isum);
    for (int j = 0; j < MR; ++j)
      for (int v = 0; v < NV; ++v) isum[j][v] = widened<FMT>(isum[j][v]);
    load_super<FMT>(block, g, G, super_d, super_m);
    for (int v = 0; v < NV; ++v) {
      qv::i32x16 sums[MR], halves[MR];
      f32x16 out[MR];
      for (int j = 0; j < MR; ++j) sums[j] = isum[j][v], halves[j] = half_sum[j][v], out[j] = acc[j][v];
      group_step<MR, FMT>(x, row0, g, G, block, v0 + v, super_d[v0 + v], super_m[v0 + v], sums, halves, out);
      for (int j = 0; j < MR; ++j) acc[j][v] = out[j];
    }
  }
  store_tile<MR, NV>(acc, v0, valid, bias, y, ldy);
}

constexpr int kQMaxRows = 4;
// units per thread below which quantized_share shares half-blocks instead of blocks
constexpr int64_t kHalvedUnits = 16;
// Whether a thread runs the halves it holds of a block (both, for every group of rows) as whole-block tiles. On
// AVX-512 builds, whose one stream a block makes a half every other 64 bytes, smollm2's one-token pass ran 5-10%
// slower with its small products (q, k, v, o, down) read by halves (Zen 4, the same bits); halves are still how
// those products are shared, so that 9 blocks go 4.5 and 4.5 to two threads. On AVX2 builds a half is two of the
// block's four streams, read whole.
#ifdef SPECDEC_AVX512
constexpr bool kWholeHalves = true;
#else
constexpr bool kWholeHalves = false;
#endif

template <int FMT, int NV, int MR = kQMaxRows>
void tile_quantized_rows(int64_t rows, const Q8Rows& x, int64_t row0, int64_t K, const uint8_t* block, int v0,
                         int valid, const float* bias, float* y, int64_t ldy) {
  if constexpr (MR > 0) {
    if (rows == MR) return tile_quantized<MR, FMT, NV>(x, row0, K, block, v0, valid, bias, y, ldy);
    tile_quantized_rows<FMT, NV, MR - 1>(rows, x, row0, K, block, v0, valid, bias, y, ldy);
  }
}

// One quantized product as the threads share it: (block, group of rows) units, or half-blocks of 32 columns where
// whole blocks would be too few to share evenly (a one-row pass over a matrix of few blocks, such as a small model's
// attention output): each output is computed the same way whichever unit holds it.
struct QuantizedShare {
  int fmt;
  const uint8_t* packed;
  int64_t M, N, K;
  const float* bias;
  float* y;
  int64_t ldy, block_bytes, groups, pieces;
  bool halves;
  int64_t units;
};

inline QuantizedShare quantized_share(int fmt, int64_t M, const uint8_t* packed, int64_t N, int64_t K,
                                      const float* bias, float* y, int64_t ldy) {
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  const int64_t groups = (M + kQMaxRows - 1) / kQMaxRows;
  const bool halves = blocks * groups < kHalvedUnits * at::get_num_threads();
  const int64_t pieces = halves ? 2 : 1;
  return {fmt, packed, M, N, K, bias, y, ldy, q_block_bytes(fmt, K / kQGroup), groups, pieces, halves,
          blocks * pieces * groups};
}

// Unit u of a product in format FMT (s.fmt); whole: the whole block of a half-block unit u (piece 0), in one tile
template <int FMT>
void quantized_unit(const Q8Rows& xq, const QuantizedShare& s, int64_t u, bool whole = false) {
  const int64_t b = u / (s.groups * s.pieces), piece = u / s.groups % s.pieces, m = u % s.groups * kQMaxRows;
  const int64_t n = b * kBlockCols;
  const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, s.N - n));
  const int v0 = static_cast<int>(piece * 2);
  const bool half = s.halves && !whole;
  if (half && !live_lanes(valid, v0)) return;
  const int64_t rows = std::min<int64_t>(kQMaxRows, s.M - m);
  const uint8_t* block = s.packed + b * s.block_bytes;
  const float* bias = s.bias ? s.bias + n : nullptr;
  float* y = s.y + m * s.ldy + n;
  if (half) tile_quantized_rows<FMT, 2>(rows, xq, m, s.K, block, v0, valid, bias, y, s.ldy);
  else tile_quantized_rows<FMT, kVecs>(rows, xq, m, s.K, block, 0, valid, bias, y, s.ldy);
}

// Units [u0, u1) of a product, one thread's share: where kWholeHalves, the blocks whose units (both halves, every
// group of rows) it holds all in whole-block tiles. A half-block's outputs are computed as the whole block's tile
// computes them, so the share changes no bit.
template <int FMT>
void quantized_units(const Q8Rows& xq, const QuantizedShare& s, int64_t u0, int64_t u1) {
  const bool wholes = kWholeHalves && s.halves;
  const int64_t per_block = s.groups * s.pieces;  // units are ordered by block, then piece, then group of rows
  for (int64_t u = u0; u < u1;) {
    if (wholes && u % per_block == 0 && u + per_block <= u1) {
      for (int64_t m = 0; m < s.groups; ++m) quantized_unit<FMT>(xq, s, u + m, true);  // piece 0's units
      u += per_block;
    } else {
      quantized_unit<FMT>(xq, s, u++);
    }
  }
}

inline void any_quantized_units(const Q8Rows& xq, const QuantizedShare& s, int64_t u0, int64_t u1) {
  with_format(s.fmt, [&](auto format) { quantized_units<decltype(format)::value>(xq, s, u0, u1); });
}

// y (M, ldy) columns [0, N) = x (M, K, quantized by quantize_rows) @ W^T (+ bias) for W packed in format FMT
// (pack_codes, pack_quantized), shared among the threads as quantized_share says
template <int FMT>
void linear_quantized(const Q8Rows& xq, int64_t M, const uint8_t* packed, int64_t N, int64_t K, const float* bias,
                      float* y, int64_t ldy) {
  const QuantizedShare share = quantized_share(FMT, M, packed, N, K, bias, y, ldy);
  at::parallel_for(0, share.units, 1, [&](int64_t u0, int64_t u1) { quantized_units<FMT>(xq, share, u0, u1); });
}

// Several products of the same activations at once (the parts of a fused weight in different formats, as a GGUF
// file's q, k and v may be), in one parallel region: each thread takes its share of every part's units, the share
// linear_quantized would give it, so that the threads stay as balanced as over one product a part, and each unit is
// computed as linear_quantized computes it: the outputs are those of one product a part.
void linear_quantized_parts(const Q8Rows& xq, const std::vector<QuantizedShare>& shares) {
  const int64_t threads = at::get_num_threads();
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      for (const QuantizedShare& s : shares) {
        const int64_t per_thread = (s.units + threads - 1) / threads;
        any_quantized_units(xq, s, std::min(s.units, t * per_thread), std::min(s.units, (t + 1) * per_thread));
      }
  });
}
