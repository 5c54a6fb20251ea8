// Quantized weights for a drafting copy of the target, in groups of 32 weights of an output row (llama.cpp's
// formats): 4-bit, w = d * u + m with u in 0..15 (Q4_1), for the decoder layers; 8-bit, w = d * q with q in
// -127..127 (Q8_0), for the LM head's best logits, which decide the drafts (screened_logits: a 4-bit head scores
// them all first). d and m are float16. Activations are rounded to int8 per group of 32 (scale max|x| / 127) and
// multiplied in integers (pairs of u8 x s8 products summed into int32). A one-token pass reads about a third of
// bfloat16's bytes: a cheap, approximate copy of the target. The target's own passes never use these products
// (theirs are the exact float32 ones of products.h). Part of cpu_llama.cpp's translation unit, included after
// quantized_layout.h, where the bytes' order is.
#pragma once

// x (M, K) float32 rounded to int8 per group of 32, with each group's scale (max|x| / 127) and exact sum (for m)
struct Q8Rows {
  std::vector<int8_t> q;
  std::vector<float> scale, sum;
};

// One group of 32 activations rounded to int8 (q = nearest-even of x * 127 / max|x|, as std::nearbyint rounds), its
// scale and its sum in k order. max ignores NaNs as std::max(amax, |x|) does. AVX2 instructions, so both builds share
// it.
inline void quantize_group(const float* xg, int8_t* q, float& scale, float& sum) {
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4], most = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    v[i] = _mm256_loadu_ps(xg + 8 * i);
    most = _mm256_max_ps(_mm256_and_ps(v[i], magnitude), most);  // the second operand where the first is NaN
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  const float amax = std::max(_mm_cvtss_f32(m4), _mm_cvtss_f32(_mm_shuffle_ps(m4, m4, 1)));
  float total = 0.f;
  for (int k = 0; k < kQGroup; ++k) total += xg[k];  // in k order: the sum the products' m terms read
  const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
  __m256i r[4];
  for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // MXCSR: nearest even
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q),
                      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  scale = amax / 127.f;
  sum = total;
}

// groups of activations a pass rounds before the threads share them (a prompt's pass; a decoding step's are few)
constexpr int64_t kParallelGroups = 512;

Q8Rows quantize_rows(const float* x, int64_t M, int64_t K) {
  const int64_t G = K / kQGroup;
  Q8Rows out{std::vector<int8_t>(M * K), std::vector<float>(M * G), std::vector<float>(M * G)};
  auto groups = [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      quantize_group(x + r * kQGroup, out.q.data() + r * kQGroup, out.scale[r], out.sum[r]);
  };
  if (M * G >= kParallelGroups) at::parallel_for(0, M * G, kParallelGroups / 4, groups);
  else groups(0, M * G);
  return out;
}

// 16 int32 lanes and the integer steps of the products, on one zmm or two ymm registers (lane l of the AVX2 pair is
// lane l of the zmm: one byte layout serves both).
namespace qv {
#ifdef SPECDEC_AVX512
using i32x16 = __m512i;
inline i32x16 zero() { return _mm512_setzero_si512(); }
inline i32x16 load(const uint8_t* p) { return _mm512_loadu_si512(p); }
inline i32x16 low_nibbles(i32x16 v) { return _mm512_and_si512(v, _mm512_set1_epi8(0x0F)); }
inline i32x16 high_nibbles(i32x16 v) { return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F)); }
inline i32x16 broadcast4(const int8_t* p) { int32_t v; std::memcpy(&v, p, 4); return _mm512_set1_epi32(v); }
inline i32x16 abs8(i32x16 x) { return _mm512_abs_epi8(x); }
// w with the sign of x applied, byte by byte (0 where x is 0 does not matter: |x| is 0 there)
inline i32x16 sign8(i32x16 w, i32x16 x) {
  return _mm512_mask_sub_epi8(w, _mm512_movepi8_mask(x), _mm512_setzero_si512(), w);
}
// acc + the sum over each lane's 4 bytes of u (unsigned) * x (signed). Without VNNI, pairs are summed in 16 bits
// first (saturating), but |pair sums| stay below 2^15 (|u| <= 127, |x| <= 127), so both give the same integers.
inline i32x16 dot4(i32x16 acc, i32x16 u, i32x16 x) {
#ifdef __AVX512VNNI__
  return _mm512_dpbusd_epi32(acc, u, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, x), _mm512_set1_epi16(1)));
#endif
}
inline f32x16 to_float(i32x16 v) { return _mm512_cvtepi32_ps(v); }
// 16-bit pair sums of u (unsigned) * x (signed) added in 16 bits, and those lanes summed in pairs into 32 bits
inline i32x16 dot2_16(i32x16 acc, i32x16 u, i32x16 x) { return _mm512_add_epi16(acc, _mm512_maddubs_epi16(u, x)); }
inline i32x16 widen16(i32x16 v) { return _mm512_madd_epi16(v, _mm512_set1_epi16(1)); }
inline i32x16 mul32(i32x16 a, i32x16 b) { return _mm512_mullo_epi32(a, b); }
inline i32x16 add32(i32x16 a, i32x16 b) { return _mm512_add_epi32(a, b); }
// 16 bytes as 16 int32 lanes: unsigned (K4's sc and mn) or signed (K6's sc)
inline i32x16 widen_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline i32x16 widen_s8(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// K5's fifth bits of one vector's 64 codes as 16 (set) or 0 per byte: its 16-byte run of 4 bit planes from `base`
// (0 for the unit's low-nibble vector, 4 for its high one), plane base + l for the codes of 128-bit lane l
inline i32x16 fifth_bits(const uint8_t* p, int base) {
  const __m512i planes = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m512i bit = _mm512_set_epi32(0, 0, 0, 0x08080808, 0, 0, 0, 0x04040404, 0, 0, 0, 0x02020202, 0, 0, 0,
                                       0x01010101);
  const __m512i lanes = _mm512_shuffle_epi32(bit, _MM_PERM_AAAA);  // each lane's bit in all its bytes
  return _mm512_maskz_mov_epi8(_mm512_test_epi8_mask(planes, _mm512_slli_epi32(lanes, base)),
                               _mm512_set1_epi8(16));
}
inline i32x16 or_bits(i32x16 a, i32x16 b) { return _mm512_or_si512(a, b); }
// An empty asm that takes v's register and gives it back: GCC otherwise reassociates a row's chain of adds into a
// tree, computing a group's every product first and spilling them to the stack (16 registers hold 4 rows' sums, not
// 64 products). Integer sums are exact in any order, so this changes speed only.
inline void pin(i32x16& v) { asm("" : "+v"(v)); }
#else
struct i32x16 { __m256i lo, hi; };
inline i32x16 zero() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline i32x16 load(const uint8_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
}
inline __m256i nib(__m256i v) { return _mm256_and_si256(v, _mm256_set1_epi8(0x0F)); }
inline i32x16 low_nibbles(i32x16 v) { return {nib(v.lo), nib(v.hi)}; }
inline i32x16 high_nibbles(i32x16 v) { return {nib(_mm256_srli_epi16(v.lo, 4)), nib(_mm256_srli_epi16(v.hi, 4))}; }
inline i32x16 broadcast4(const int8_t* p) {
  int32_t v; std::memcpy(&v, p, 4); const __m256i b = _mm256_set1_epi32(v); return {b, b};
}
inline i32x16 abs8(i32x16 x) { return {_mm256_abs_epi8(x.lo), _mm256_abs_epi8(x.hi)}; }
inline i32x16 sign8(i32x16 w, i32x16 x) { return {_mm256_sign_epi8(w.lo, x.lo), _mm256_sign_epi8(w.hi, x.hi)}; }
inline __m256i dot4_half(__m256i acc, __m256i u, __m256i x) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1)));
}
inline i32x16 dot4(i32x16 acc, i32x16 u, i32x16 x) {
  return {dot4_half(acc.lo, u.lo, x.lo), dot4_half(acc.hi, u.hi, x.hi)};
}
inline f32x16 to_float(i32x16 v) { return {_mm256_cvtepi32_ps(v.lo), _mm256_cvtepi32_ps(v.hi)}; }
inline i32x16 dot2_16(i32x16 acc, i32x16 u, i32x16 x) {
  return {_mm256_add_epi16(acc.lo, _mm256_maddubs_epi16(u.lo, x.lo)),
          _mm256_add_epi16(acc.hi, _mm256_maddubs_epi16(u.hi, x.hi))};
}
inline i32x16 widen16(i32x16 v) {
  const __m256i ones = _mm256_set1_epi16(1);
  return {_mm256_madd_epi16(v.lo, ones), _mm256_madd_epi16(v.hi, ones)};
}
inline i32x16 mul32(i32x16 a, i32x16 b) { return {_mm256_mullo_epi32(a.lo, b.lo), _mm256_mullo_epi32(a.hi, b.hi)}; }
inline i32x16 add32(i32x16 a, i32x16 b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }
inline __m128i bytes16(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
inline i32x16 widen_u8(const uint8_t* p) {
  const __m128i b = bytes16(p);
  return {_mm256_cvtepu8_epi32(b), _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8))};
}
inline i32x16 widen_s8(const uint8_t* p) {
  const __m128i b = bytes16(p);
  return {_mm256_cvtepi8_epi32(b), _mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))};
}
// K5's fifth bits of one vector's 64 codes as 16 (set) or 0 per byte: its 16-byte run of 4 bit planes from `base`
// (0 for the unit's low-nibble vector, 4 for its high one), plane base + l for the codes of 128-bit lane l
inline i32x16 fifth_bits(const uint8_t* p, int base) {
  const __m256i planes = _mm256_broadcastsi128_si256(bytes16(p));
  const __m256i first = _mm256_setr_m128i(_mm_set1_epi8(static_cast<char>(1 << base)),
                                          _mm_set1_epi8(static_cast<char>(2 << base)));
  const __m256i second = _mm256_slli_epi16(first, 2);
  const __m256i sixteen = _mm256_set1_epi8(16);
  auto bits = [&](__m256i plane) {
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(planes, plane), plane), sixteen);
  };
  return {bits(first), bits(second)};
}
inline i32x16 or_bits(i32x16 a, i32x16 b) { return {_mm256_or_si256(a.lo, b.lo), _mm256_or_si256(a.hi, b.hi)}; }
inline void pin(i32x16& v) { asm("" : "+x"(v.lo), "+x"(v.hi)); }
#endif
inline f32x16 load_f16(const uint8_t* p) { return vec::load_f16(reinterpret_cast<const uint16_t*>(p)); }
}  // namespace qv

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
// loop over an array; what keeps them in registers is qv::pin.
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

// Output n of the 8-bit product for row `row` of x (quantized): the same integer sums and the same float32 steps,
// in the same order, as tile_quantized<., 8> computes it, so the value is the same to the bit.
float quantized_output8(const Q8Rows& x, int64_t row, const uint8_t* packed, int64_t n, int64_t K) {
  using L = QLayout<8>;
  const int64_t G = K / kQGroup;
  const uint8_t* block = packed + (n / kBlockCols) * G * q_group_bytes(8);
  const int i = static_cast<int>(n % kBlockCols), v = i / 16, lane = i % 16;
  float acc = 0.f;
  for (int64_t g = 0; g < G; ++g) {
    const int8_t* xg = x.q.data() + row * K + g * kQGroup;
    int32_t sum = 0;
    for (int quad = 0; quad < kQGroup / 4; ++quad)
      for (int j = 0; j < 4; ++j)
        sum += static_cast<int8_t>(block[L::unit(g, quad, v, G) + 4 * lane + j]) * xg[quad * 4 + j];
    uint16_t half;
    std::memcpy(&half, block + L::d(g, v, G) + 2 * lane, sizeof(half));
    acc = std::fma(static_cast<float>(sum), _cvtsh_ss(half) * x.scale[row * G + g], acc);
  }
  return acc;
}

// Logits of a drafting copy (R, N) for x (R, K): a 4-bit screen of every output, then the `rescored` highest of each
// row computed again from the 8-bit weights (quantized_output8): the drafts come from the 8-bit values where they
// matter, for the bytes of a 4-bit pass.
void screened_logits(const float* x, int64_t R, const uint8_t* screen, const uint8_t* exact, int64_t N, int64_t K,
                     int rescored, float* y) {
  const Q8Rows xq = quantize_rows(x, R, K);  // the screen's and the rescoring's
  linear_quantized<4>(xq, R, screen, N, K, nullptr, y, N);
  const int64_t top = std::min<int64_t>(rescored, N);
  std::vector<int64_t> best;  // the row's highest outputs so far, highest first (ties: the lower index)
  for (int64_t r = 0; r < R; ++r) {
    float* row = y + r * N;
    best.clear();
    for (int64_t n = 0; n < N; ++n) {
      if (static_cast<int64_t>(best.size()) == top && row[n] <= row[best.back()]) continue;  // most stop here
      auto at = std::upper_bound(best.begin(), best.end(), n, [row](int64_t a, int64_t b) { return row[a] > row[b]; });
      best.insert(at, n);
      if (static_cast<int64_t>(best.size()) > top) best.pop_back();
    }
    for (int64_t n : best) row[n] = quantized_output8(xq, r, exact, n, K);
  }
}
