// Quantized weights' products, in groups of 32 weights of an output row (quantized_layout.h's formats: llama.cpp's
// Q4_0/Q4_1, Q8_0, Q4_K, Q5_K and Q6_K, and the drafting copy's 4-bit layers and 8-bit head): activations rounded to
// int8 per group (int8_lanes.h), integer sums of codes times them per group, then the format's float32 steps. The
// tiles for one row (decoding and drafting steps) and for several (verification, batches, prefill), both ending
// each group with group_step, so a row's outputs do not depend on which tile computed them. Part of cpu_llama.cpp's
// translation unit, included after int8_lanes.h.
#pragma once

// 4-bit codes (u <= 15) times int8 activations (|x| <= 127) in pairs stay below 2 * 15 * 127 = 3,810, so a group's
// 8 quads of them add up in 16 bits (|sum| <= 30,480 < 2^15) exactly; one widening a group then replaces one per
// quad. So do K6's codes (|q| <= 32: pairs below 8,128) and K5's (u <= 31: pairs below 7,874) over the 4 quads of
// half a group, widened at its middle. VNNI's dpbusd sums into 32 bits in one instruction already.
#ifdef __AVX512VNNI__
constexpr bool kSum16 = false;
#else
constexpr bool kSum16 = true;
#endif
template <int FMT>
constexpr bool sums16() { return kSum16 && (q_bits(FMT) == 4 || FMT == K6); }

// One quad's products added into a row's sums: 4-bit codes (unsigned) times x; 8-bit codes as |w| (unsigned)
// times x with w's sign. In 16-bit lanes where sums16, in 32-bit ones otherwise.
template <int FMT>
inline __attribute__((always_inline)) qv::i32x16 add_quad(qv::i32x16 isum, qv::i32x16 w, qv::i32x16 xb) {
  if constexpr (q_bits(FMT) == 4) return sums16<FMT>() ? qv::dot2_16(isum, w, xb) : qv::dot4(isum, w, xb);
  else if constexpr (sums16<FMT>()) return qv::dot2_16(isum, qv::abs8(w), qv::sign8(xb, w));
  else return qv::dot4(isum, qv::abs8(w), qv::sign8(xb, w));
}

// The sums in 32-bit lanes (a group's, or K6's half-group's)
template <int FMT>
inline __attribute__((always_inline)) qv::i32x16 widened(qv::i32x16 isum) {
  if constexpr (sums16<FMT>()) return qv::widen16(isum);
  else return isum;
}

// K6's first half-group: its sums times its sc; the sums restart for the second half
template <int FMT>
inline __attribute__((always_inline)) qv::i32x16 close_first_half(qv::i32x16& isum, qv::i32x16 sc) {
  const qv::i32x16 first = qv::mul32(widened<FMT>(isum), sc);
  isum = qv::zero();
  return first;
}

// A unit's quad of 4-bit codes (`both`, loaded from `quad`) as one vector's codes: its low (HIGH false) or high
// nibbles, with K5's fifth bits
template <int FMT, bool HIGH>
inline __attribute__((always_inline)) qv::i32x16 vector_codes(const uint8_t* quad, qv::i32x16 both) {
  const qv::i32x16 w = HIGH ? qv::high_nibbles(both) : qv::low_nibbles(both);
  if constexpr (FMT == K5) return qv::or_bits(w, qv::fifth_bits(quad + 64, HIGH ? 4 : 0));
  else return w;
}

// K5's 16-bit sums restart at the middle of a group (sums16): the first half's, widened, wait in `half` until
// group_step adds them
template <int FMT>
inline __attribute__((always_inline)) void k5_middle(int quad, qv::i32x16& isum, qv::i32x16& half) {
  if constexpr (FMT == K5 && sums16<FMT>()) {
    if (quad == kQGroup / 8) {
      half = qv::widen16(isum);
      isum = qv::zero();
    }
  }
}

// A K-quant's super-block numbers (d, and -dmin for K4 and K5) of the block's four vectors, read at the first group of
// each super-block
template <int FMT>
inline __attribute__((always_inline)) void load_super(const uint8_t* block, int64_t g, int64_t G,
                                                      f32x16 (&super_d)[kVecs], f32x16 (&super_m)[kVecs]) {
  using L = QLayout<FMT>;
  if constexpr (k_quant(FMT)) {
    if (g % kQSuper) return;
    for (int v = 0; v < kVecs; ++v) {
      super_d[v] = qv::load_f16(block + L::super_d(g, v, G));
      if constexpr (k_min(FMT)) super_m[v] = qv::load_f16(block + L::super_m(g, v, G));
    }
  }
}

// A group's float32 step for one vector of 16 columns (v) and MR rows: acc += (d * scale_x) * sum (+ m * sum_x),
// where d and m are the format's (QFormat), K5's and K6's halves combined first. Both tiles below end each group
// with it, so every output sees the same float operations in the same order whichever tile computed it.
template <int MR, int FMT>
inline __attribute__((always_inline)) void group_step(const Q8Rows& x, int64_t row0, int64_t g, int64_t G,
                                                      const uint8_t* __restrict block, int v, const f32x16& super_d,
                                                      const f32x16& super_m, qv::i32x16 (&isum)[MR],
                                                      const qv::i32x16 (&half_sum)[MR], f32x16 (&acc)[MR]) {
  using L = QLayout<FMT>;
  f32x16 d, m;
  if constexpr (k_min(FMT)) {
    d = vec::mul(super_d, qv::to_float(qv::widen_u8(block + L::d(g, v, G))));  // exact: 11 + 6 bits
    m = vec::mul(super_m, qv::to_float(qv::widen_u8(block + L::m(g, v, G))));
    if constexpr (FMT == K5)
      for (int j = 0; j < MR; ++j) isum[j] = qv::add32(half_sum[j], isum[j]);
  } else if constexpr (FMT == K6) {
    d = super_d;
    const qv::i32x16 sc = qv::widen_s8(block + L::m(g, v, G));
    for (int j = 0; j < MR; ++j) isum[j] = qv::add32(half_sum[j], qv::mul32(isum[j], sc));
  } else {
    d = qv::load_f16(block + L::d(g, v, G));
    if constexpr (FMT == Q4) m = qv::load_f16(block + L::m(g, v, G));
  }
  for (int j = 0; j < MR; ++j) {
    const int64_t r = (row0 + j) * G + g;
    acc[j] = vec::fmadd(qv::to_float(isum[j]), vec::mul(d, vec::set1(x.scale[r])), acc[j]);
    if constexpr (has_min(FMT)) acc[j] = vec::fmadd(m, vec::set1(x.sum[r]), acc[j]);
  }
}

// Up to 4 rows' integer sums of one vector, as named members, each row's step written out (row_quad) instead of a
// loop over an array. qv::pin keeps the chains of adds from becoming trees; with it, the same tile over an array of
// sums (pinned too) ran smollm2's 16- and 200-token passes about 7% slower (more stack traffic around the groups).
struct RowSums {
  qv::i32x16 r0, r1, r2, r3;
};

template <int J>
inline __attribute__((always_inline)) qv::i32x16& row_of(RowSums& s) {
  if constexpr (J == 0) return s.r0;
  else if constexpr (J == 1) return s.r1;
  else if constexpr (J == 2) return s.r2;
  else return s.r3;
}

// Row J's step at a quad (MR rows, J < MR): K5's middle, then the quad's products added to its sums
template <int MR, int FMT, int J>
inline __attribute__((always_inline)) void row_quad(int quad, RowSums& sums, RowSums& halves, qv::i32x16 w,
                                                    const int8_t* xj) {
  if constexpr (J < MR) {
    k5_middle<FMT>(quad, row_of<J>(sums), row_of<J>(halves));
    row_of<J>(sums) = add_quad<FMT>(row_of<J>(sums), w, qv::broadcast4(xj + quad * 4));
    qv::pin(row_of<J>(sums));
  }
}

template <int MR, int FMT, int J>
inline __attribute__((always_inline)) void close_row_half(RowSums& sums, RowSums& halves, qv::i32x16 sc) {
  if constexpr (J < MR) row_of<J>(halves) = close_first_half<FMT>(row_of<J>(sums), sc);
}

// One vector of 16 columns (v) for MR <= 4 rows on AVX2 (16 registers): the rows' integer sums (two registers each),
// the quad's weights (two) and one broadcast of activations stay in registers. Each row reads its activations
// through a pointer of its own, so every broadcast is one load at a constant offset; 4-bit weights take their low
// or high nibbles (HIGH: v is odd), known before the loop. The integer sums are exact in any order, and each group
// ends with group_step as in tile_quantized: the same outputs.
template <int MR, int FMT, bool HIGH>
inline __attribute__((always_inline)) void vector_by_rows(const Q8Rows& x, int64_t row0, int64_t K,
                                                          const uint8_t* __restrict block, int v,
                                                          f32x16 (&acc)[MR]) {
  static_assert(MR <= 4, "RowSums holds 4 rows");
  using L = QLayout<FMT>;
  const int64_t G = K / kQGroup;
  f32x16 super_d[kVecs], super_m[kVecs];
  const int8_t* x0 = x.q.data() + row0 * K;
  const int8_t* x1 = x0 + (MR > 1 ? K : 0);
  const int8_t* x2 = x0 + (MR > 2 ? 2 * K : 0);
  const int8_t* x3 = x0 + (MR > 3 ? 3 * K : 0);
  for (int64_t g = 0; g < G; ++g, x0 += kQGroup, x1 += kQGroup, x2 += kQGroup, x3 += kQGroup) {
    load_super<FMT>(block, g, G, super_d, super_m);
    const uint8_t* unit = block + L::unit(g, 0, L::kBits == 4 ? v / 2 : v, G);
    RowSums sums{qv::zero(), qv::zero(), qv::zero(), qv::zero()}, halves = sums;
#pragma GCC unroll 8
    for (int quad = 0; quad < kQGroup / 4; ++quad) {
      if constexpr (FMT == K6) {
        if (quad == kQGroup / 8) {
          const qv::i32x16 sc = qv::widen_s8(block + L::d(g, v, G));
          close_row_half<MR, FMT, 0>(sums, halves, sc), close_row_half<MR, FMT, 1>(sums, halves, sc);
          close_row_half<MR, FMT, 2>(sums, halves, sc), close_row_half<MR, FMT, 3>(sums, halves, sc);
        }
      }
      const uint8_t* at = unit + quad * L::kQuadStep;
      qv::i32x16 w = qv::load(at);
      if constexpr (L::kBits == 4) w = vector_codes<FMT, HIGH>(at, w);
      row_quad<MR, FMT, 0>(quad, sums, halves, w, x0), row_quad<MR, FMT, 1>(quad, sums, halves, w, x1);
      row_quad<MR, FMT, 2>(quad, sums, halves, w, x2), row_quad<MR, FMT, 3>(quad, sums, halves, w, x3);
    }
    qv::i32x16 isum[MR], half_sum[MR];
    const qv::i32x16 all[4] = {sums.r0, sums.r1, sums.r2, sums.r3}, all_halves[4] = {halves.r0, halves.r1,
                                                                                     halves.r2, halves.r3};
    for (int j = 0; j < MR; ++j) isum[j] = widened<FMT>(all[j]), half_sum[j] = all_halves[j];
    group_step<MR, FMT>(x, row0, g, G, block, v, super_d[v], super_m[v], isum, half_sum, acc);
  }
}

// The tile for several rows on AVX2: the block's vectors [v0, v0 + NV) one at a time (vector_by_rows), the weights'
// nibble half chosen outside the loops over k.
template <int MR, int FMT, int NV>
__attribute__((noinline)) void tile_quantized_by_vector(const Q8Rows& x, int64_t row0, int64_t K,
                                                        const uint8_t* __restrict block, int v0, int valid,
                                                        const float* __restrict bias, float* __restrict y,
                                                        int64_t ldy) {
  f32x16 acc[MR][NV];
  for (int j = 0; j < MR; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = vec::zero();
  for (int v = 0; v < NV && live_lanes(valid, v0 + v); ++v) {
    f32x16 out[MR];
    for (int j = 0; j < MR; ++j) out[j] = vec::zero();
    if constexpr (q_bits(FMT) == 4) {
      if ((v0 + v) % 2) vector_by_rows<MR, FMT, true>(x, row0, K, block, v0 + v, out);
      else vector_by_rows<MR, FMT, false>(x, row0, K, block, v0 + v, out);
    } else {
      vector_by_rows<MR, FMT, false>(x, row0, K, block, v0 + v, out);
    }
    for (int j = 0; j < MR; ++j) acc[j][v] = out[j];
  }
  store_tile<MR, NV>(acc, v0, valid, bias, y, ldy);
}

// The outputs of the block's vectors [v0, v0 + NV) (NV of 2 or 4 vectors of 16 columns, v0 even) for MR rows of x
// (quantized): per group, integer sums of the stored integers times x's, then acc += (d * scale_x) * sum (+ m *
// sum_x where the format has a minimum), in the format's float32 steps (QFormat). 8-bit codes are signed: |w|
// (unsigned) times x with w's sign, so that q = -128 (Q8_0 allows it) is exact too. K6's two halves of a group have
// their own sc: their sums are scaled in int32 (exact: |sum| < 2^16, |sc| <= 128) and added before the one
// conversion to float (exact below 2^24).
template <int MR, int FMT, int NV>
__attribute__((noinline)) void tile_quantized(const Q8Rows& x, int64_t row0, int64_t K,
                                              const uint8_t* __restrict block, int v0, int valid,
                                              const float* __restrict bias, float* __restrict y, int64_t ldy) {
#ifndef SPECDEC_AVX512
  if constexpr (MR > 1) return tile_quantized_by_vector<MR, FMT, NV>(x, row0, K, block, v0, valid, bias, y, ldy);
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
    qv::i32x16 isum[MR][NV], half_sum[MR][NV];
    for (int j = 0; j < MR; ++j)
      for (int v = 0; v < NV; ++v) isum[j][v] = qv::zero(), half_sum[j][v] = qv::zero();
#pragma GCC unroll 8
    for (int quad = 0; quad < kQGroup / 4; ++quad) {
      for (int j = 0; j < MR; ++j)
        for (int v = 0; v < NV; ++v) k5_middle<FMT>(quad, isum[j][v], half_sum[j][v]);
      if constexpr (FMT == K6) {
        if (quad == kQGroup / 8) {
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
          w[2 * u] = vector_codes<FMT, false>(at, both), w[2 * u + 1] = vector_codes<FMT, true>(at, both);
        }
      } else {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) w[v] = qv::load(units[v] + quad * L::kQuadStep);
      }
#pragma GCC unroll 4
      for (int j = 0; j < MR; ++j) {
        const qv::i32x16 xb = qv::broadcast4(x.q.data() + (row0 + j) * K + g * kQGroup + quad * 4);
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) isum[j][v] = add_quad<FMT>(isum[j][v], w[v], xb), qv::pin(isum[j][v]);
      }
    }
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
// units per thread below which linear_quantized shares half-blocks instead of blocks
constexpr int64_t kHalvedUnits = 16;

template <int FMT, int NV, int MR = kQMaxRows>
void tile_quantized_rows(int64_t rows, const Q8Rows& x, int64_t row0, int64_t K, const uint8_t* block, int v0,
                         int valid, const float* bias, float* y, int64_t ldy) {
  if constexpr (MR > 0) {
    if (rows == MR) return tile_quantized<MR, FMT, NV>(x, row0, K, block, v0, valid, bias, y, ldy);
    tile_quantized_rows<FMT, NV, MR - 1>(rows, x, row0, K, block, v0, valid, bias, y, ldy);
  }
}

// y (M, ldy) columns [0, N) = x (M, K, quantized by quantize_rows) @ W^T (+ bias) for W packed in format FMT
// (pack_codes, pack_quantized). The threads share (block, group of rows) units, or half-blocks of 32 columns where
// whole blocks would be too few to share evenly (a one-row pass over a matrix of few blocks, such as a small model's
// attention output): each output is computed the same way whichever unit holds it.
template <int FMT>
void linear_quantized(const Q8Rows& xq, int64_t M, const uint8_t* packed, int64_t N, int64_t K, const float* bias,
                      float* y, int64_t ldy) {
  const int64_t block_bytes = QLayout<FMT>::block_bytes(K / kQGroup);
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  const int64_t groups = (M + kQMaxRows - 1) / kQMaxRows;
  const bool halves = blocks * groups < kHalvedUnits * at::get_num_threads();
  const int64_t pieces = halves ? 2 : 1;
  at::parallel_for(0, blocks * pieces * groups, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / (groups * pieces), piece = u / groups % pieces, m = u % groups * kQMaxRows;
      const int64_t n = b * kBlockCols;
      const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, N - n));
      const int v0 = static_cast<int>(piece * 2);
      if (halves && !live_lanes(valid, v0)) continue;
      const int64_t rows = std::min<int64_t>(kQMaxRows, M - m);
      const uint8_t* block = packed + b * block_bytes;
      const float* block_bias = bias ? bias + n : nullptr;
      if (halves) tile_quantized_rows<FMT, 2>(rows, xq, m, K, block, v0, valid, block_bias, y + m * ldy + n, ldy);
      else tile_quantized_rows<FMT, kVecs>(rows, xq, m, K, block, 0, valid, block_bias, y + m * ldy + n, ldy);
    }
  });
}
