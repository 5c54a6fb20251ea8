// The steps of the quantized products (quantized_layout.h's formats: llama.cpp's Q4_0/Q4_1, Q8_0, Q4_K, Q5_K and
// Q6_K, and the drafting copy's 4-bit layers and 8-bit head), which every tile is made of: a quad's integer
// products added into a row's sums, a unit's codes, and a group's float32 step (group_step), which every tile ends
// each group with, so that a row's outputs do not depend on which tile computed them. Part of cpu_llama.cpp's
// translation unit, included after int8_lanes.h and before quantized_rows.h and quantized.h.
#pragma once

// 4-bit codes (u <= 15) times int8 activations (|x| <= 127) in pairs stay below 2 * 15 * 127 = 3,810, so a group's
// 8 quads of them add up in 16 bits (|sum| <= 30,480 < 2^15) exactly; one widening a group then replaces one per
// quad. So do K6's codes (|q| <= 32: pairs below 8,128, once k6_half_offset is taken off) and K5's (u <= 31: pairs
// below 7,874) over the 4 quads of half a group, widened at its middle. VNNI's dpbusd sums into 32 bits in one
// instruction already.
#ifdef __AVX512VNNI__
constexpr bool kSum16 = false;
#else
constexpr bool kSum16 = true;
#endif
template <int FMT>
constexpr bool sums16() { return kSum16 && q_bits(FMT) == 4; }

// One quad's products added into a row's sums: unsigned codes times x; signed ones (Q8's) as |w| (unsigned)
// times x with w's sign. In 16-bit lanes where sums16, in 32-bit ones otherwise.
template <int FMT, bool SIGNED = signed_codes(FMT)>
inline __attribute__((always_inline)) qv::i32x16 add_quad(qv::i32x16 isum, qv::i32x16 w, qv::i32x16 xb) {
  if constexpr (!SIGNED) return sums16<FMT>() ? qv::dot2_16(isum, w, xb) : qv::dot4(isum, w, xb);
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
// nibbles, with K5's fifth bits or K6's fifth and sixth (u in 0..63, q = u - 32: k6_half_offset)
template <int FMT, bool HIGH>
inline __attribute__((always_inline)) qv::i32x16 vector_codes(const uint8_t* quad, qv::i32x16 both) {
  const qv::i32x16 w = HIGH ? qv::high_nibbles(both) : qv::low_nibbles(both);
  constexpr int base = HIGH ? 4 : 0;
  if constexpr (FMT == K5) return qv::or_bits(w, qv::fifth_bits(quad + 64, base));
  else if constexpr (FMT == K6) return qv::or_bits(w, qv::crumbs<base>(quad + 64));
  else return w;
}

// K6's codes are taken unsigned (u = q + 32, as vector_codes gives them), so that a quad's products are one
// instruction (dpbusd, or maddubs) instead of four that would apply q's sign to x. At the end of each half-group its
// row's sums lose 32 times the half's 16 activations' sum (x_half), which leaves those of q times x: in 16-bit lanes
// where sums16 (the sums of u times x may wrap there, which is exact modulo 2^16, and those of q times x stay below
// 2^15: see sums16), in 32-bit lanes otherwise. The same integers as signed codes would give, so the same outputs.
template <int FMT>
inline __attribute__((always_inline)) qv::i32x16 k6_half_offset(const int8_t* x_half) {
  if constexpr (sums16<FMT>()) return qv::k6_offset(x_half);
  else return qv::k6_offset32(x_half);
}

template <int FMT>
inline __attribute__((always_inline)) qv::i32x16 less_offset(qv::i32x16 isum, qv::i32x16 offset) {
  if constexpr (sums16<FMT>()) return qv::sub16(isum, offset);
  else return qv::sub32(isum, offset);
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
    if constexpr (FMT == Q40) m = vec::mul(d, vec::set1(-8.0f));  // exact: the value Q4 would store
  }
  for (int j = 0; j < MR; ++j) {
    const int64_t r = (row0 + j) * G + g;
    acc[j] = vec::fmadd(qv::to_float(isum[j]), vec::mul(d, vec::set1(x.scale[r])), acc[j]);
    if constexpr (has_min(FMT)) acc[j] = vec::fmadd(m, vec::set1(x.sum[r]), acc[j]);
  }
}
