// Activations rounded to int8 per group of 32 (scale max|x| / 127), and the integer steps of the quantized products
// on 16 int32 lanes (one zmm, or two ymm on AVX2). Part of cpu_llama.cpp's translation unit, included after
// quantized_layout.h and before quantized.h.
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
inline i32x16 sub8(i32x16 a, char b) { return _mm512_sub_epi8(a, _mm512_set1_epi8(b)); }
inline i32x16 sub16(i32x16 a, i32x16 b) { return _mm512_sub_epi16(a, b); }
inline i32x16 sub32(i32x16 a, i32x16 b) { return _mm512_sub_epi32(a, b); }
inline i32x16 broadcast128(__m128i p) { return _mm512_broadcast_i32x4(p); }
inline i32x16 broadcast32(__m128i p) { return _mm512_broadcastd_epi32(p); }
// K6's two high bits of one vector's 64 codes, at bits 4 and 5 of each byte: from the unit's 32 bytes of them, code c
// of the vector at byte c % 32, bits BASE + 2 (c / 32) (BASE 0 for the unit's low-nibble vector, 4 for its high one)
template <int BASE>
inline i32x16 crumbs(const uint8_t* p) {
  const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  const __m512i shift = _mm512_inserti64x4(_mm512_set1_epi16(BASE), _mm256_set1_epi16(BASE + 2), 1);
  return _mm512_slli_epi16(_mm512_and_si512(_mm512_srlv_epi16(both, shift), _mm512_set1_epi8(3)), 4);
}
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
inline i32x16 sub8(i32x16 a, char b) {
  const __m256i v = _mm256_set1_epi8(b);
  return {_mm256_sub_epi8(a.lo, v), _mm256_sub_epi8(a.hi, v)};
}
inline i32x16 sub16(i32x16 a, i32x16 b) { return {_mm256_sub_epi16(a.lo, b.lo), _mm256_sub_epi16(a.hi, b.hi)}; }
inline i32x16 sub32(i32x16 a, i32x16 b) { return {_mm256_sub_epi32(a.lo, b.lo), _mm256_sub_epi32(a.hi, b.hi)}; }
inline i32x16 broadcast128(__m128i p) { const __m256i b = _mm256_broadcastsi128_si256(p); return {b, b}; }
inline i32x16 broadcast32(__m128i p) { const __m256i b = _mm256_broadcastd_epi32(p); return {b, b}; }
// K6's two high bits of one vector's 64 codes at bits 4 and 5 of each byte, as the AVX-512 crumbs above: a shift
// within each byte's 16-bit lane (bits that cross into the next byte are masked off)
template <int FROM>  // the pair's lowest bit, moved to bit 4
inline __m256i crumb_half(__m256i bits) {
  __m256i moved = bits;
  if constexpr (FROM < 4) moved = _mm256_slli_epi16(bits, 4 - FROM);
  else if constexpr (FROM > 4) moved = _mm256_srli_epi16(bits, FROM - 4);
  return _mm256_and_si256(moved, _mm256_set1_epi8(0x30));
}
template <int BASE>
inline i32x16 crumbs(const uint8_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return {crumb_half<BASE>(bits), crumb_half<BASE + 2>(bits)};
}
inline void pin(i32x16& v) { asm("" : "+x"(v.lo), "+x"(v.hi)); }
#endif
// 32 times the pair sums of 16 activations (half a group: 4 quads of 4), as 16-bit lanes in the pattern of
// dot2_16's: lane 2i holds 32 (x0 + x1) summed over the quads, lane 2i + 1 32 (x2 + x3) (|.| <= 32 * 4 * 254 < 2^15)
inline i32x16 k6_offset(const int8_t* x) {
  __m128i p = _mm_maddubs_epi16(_mm_set1_epi8(32), _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  p = _mm_add_epi16(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(1, 0, 3, 2)));
  p = _mm_add_epi16(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
  return broadcast128(p);
}
// 32 times the sum of 16 activations (half a group) in every 32-bit lane: the offset of k6_offset for sums in 32 bits
inline i32x16 k6_offset32(const int8_t* x) {
  __m128i p = _mm_maddubs_epi16(_mm_set1_epi8(32), _mm_loadu_si128(reinterpret_cast<const __m128i*>(x)));
  p = _mm_madd_epi16(p, _mm_set1_epi16(1));
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(1, 0, 3, 2)));
  p = _mm_add_epi32(p, _mm_shuffle_epi32(p, _MM_SHUFFLE(2, 3, 0, 1)));
  return broadcast32(p);
}
inline f32x16 load_f16(const uint8_t* p) { return vec::load_f16(reinterpret_cast<const uint16_t*>(p)); }
}  // namespace qv
