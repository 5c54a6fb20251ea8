// 16 float32 lanes for specdec's CPU kernels: one __m512 on CPUs with AVX-512, two __m256 on AVX2 (with FMA and
// F16C). Every operation is lane-wise, lane l computing the same float32 operation on both, so the kernels'
// reduction orders (and with them batch invariance) are the same whichever register width carries them. The
// horizontal sum adds the lanes in a fixed tree, the same on every call.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace vec {

#ifdef __AVX512F__

using f32x16 = __m512;

inline f32x16 zero() { return _mm512_setzero_ps(); }
inline f32x16 set1(float x) { return _mm512_set1_ps(x); }
inline f32x16 load(const float* p) { return _mm512_loadu_ps(p); }
inline void store(float* p, f32x16 v) { _mm512_storeu_ps(p, v); }
inline f32x16 add(f32x16 a, f32x16 b) { return _mm512_add_ps(a, b); }
inline f32x16 sub(f32x16 a, f32x16 b) { return _mm512_sub_ps(a, b); }
inline f32x16 mul(f32x16 a, f32x16 b) { return _mm512_mul_ps(a, b); }
inline f32x16 div(f32x16 a, f32x16 b) { return _mm512_div_ps(a, b); }
inline f32x16 min(f32x16 a, f32x16 b) { return _mm512_min_ps(a, b); }
inline f32x16 max(f32x16 a, f32x16 b) { return _mm512_max_ps(a, b); }
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fmadd_ps(a, b, c); }   // a * b + c
inline f32x16 fnmadd(f32x16 a, f32x16 b, f32x16 c) { return _mm512_fnmadd_ps(a, b, c); } // c - a * b
inline float sum(f32x16 v) { return _mm512_reduce_add_ps(v); }
inline f32x16 round_even(f32x16 v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
// p * 2^n for integral n in [-150, 128]
inline f32x16 scale2(f32x16 p, f32x16 n) { return _mm512_scalef_ps(p, n); }

// 16 bfloat16 or float16 values, widened to float32
inline f32x16 load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline f32x16 load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }

// The first `count` lanes (0 to 16) of a vector: loads read no memory past them and give zeros there, stores
// write only them.
inline __mmask16 first(int count) { return (__mmask16)(count >= 16 ? 0xFFFF : (1u << count) - 1); }
inline f32x16 load_first(int count, const float* p) { return _mm512_maskz_loadu_ps(first(count), p); }
inline void store_first(int count, float* p, f32x16 v) { _mm512_mask_storeu_ps(p, first(count), v); }
inline f32x16 keep_first(int count, f32x16 v) { return _mm512_maskz_mov_ps(first(count), v); }

#else  // AVX2

struct f32x16 {
  __m256 lo, hi;  // lanes 0-7, 8-15
};

inline f32x16 zero() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline f32x16 set1(float x) { const __m256 v = _mm256_set1_ps(x); return {v, v}; }
inline f32x16 load(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store(float* p, f32x16 v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
inline f32x16 add(f32x16 a, f32x16 b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline f32x16 sub(f32x16 a, f32x16 b) { return {_mm256_sub_ps(a.lo, b.lo), _mm256_sub_ps(a.hi, b.hi)}; }
inline f32x16 mul(f32x16 a, f32x16 b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline f32x16 div(f32x16 a, f32x16 b) { return {_mm256_div_ps(a.lo, b.lo), _mm256_div_ps(a.hi, b.hi)}; }
inline f32x16 min(f32x16 a, f32x16 b) { return {_mm256_min_ps(a.lo, b.lo), _mm256_min_ps(a.hi, b.hi)}; }
inline f32x16 max(f32x16 a, f32x16 b) { return {_mm256_max_ps(a.lo, b.lo), _mm256_max_ps(a.hi, b.hi)}; }
inline f32x16 fmadd(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline f32x16 fnmadd(f32x16 a, f32x16 b, f32x16 c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
// the same tree as AVX-512's reduction: halves, then quarters, pairs and the last two lanes
inline float sum(f32x16 v) {
  const __m256 eight = _mm256_add_ps(v.lo, v.hi);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}
inline f32x16 round_even(f32x16 v) {
  constexpr int mode = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  return {_mm256_round_ps(v.lo, mode), _mm256_round_ps(v.hi, mode)};
}
// p * 2^n for integral n in [-150, 128], rounded once as scalef rounds: p * 2^(n >> 1) is exact (p is near 1),
// then one product by 2^(n - (n >> 1)), each power a normal float32
inline __m256 scale2_half(__m256 p, __m256 n) {
  const __m256i e = _mm256_cvtps_epi32(n);
  const __m256i e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, p1), p2);
}
inline f32x16 scale2(f32x16 p, f32x16 n) { return {scale2_half(p.lo, n.lo), scale2_half(p.hi, n.hi)}; }

inline __m256 widen_bf16(__m128i h) { return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); }
inline f32x16 load_bf16(const uint16_t* p) {
  return {widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          widen_bf16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}
inline f32x16 load_f16(const uint16_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8)))};
}

// all ones in the lanes of a half (first lane `base`) that are below count
inline __m256i first_half(int count, int base) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count - base), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
// A whole vector goes through plain loads and stores: masked stores are slow on AMD's cores, and every tile's
// outputs paid for them.
inline f32x16 load_first(int count, const float* p) {
  if (count >= 16) return load(p);
  return {_mm256_maskload_ps(p, first_half(count, 0)), _mm256_maskload_ps(p + 8, first_half(count, 8))};
}
inline void store_first(int count, float* p, f32x16 v) {
  if (count >= 16) return store(p, v);
  _mm256_maskstore_ps(p, first_half(count, 0), v.lo);
  _mm256_maskstore_ps(p + 8, first_half(count, 8), v.hi);
}
inline f32x16 keep_first(int count, f32x16 v) {
  return {_mm256_and_ps(v.lo, _mm256_castsi256_ps(first_half(count, 0))),
          _mm256_and_ps(v.hi, _mm256_castsi256_ps(first_half(count, 8)))};
}

#endif

}  // namespace vec
