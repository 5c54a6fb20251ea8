// Row-wise operations of a decoder layer: dot products, e^x, RMSNorm, RoPE and SwiGLU, each row's result
// depending only on that row. Part of cpu_llama.cpp's translation unit.
#pragma once

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

// Softmax numerators in place: w[i] = e^(w[i] - top) for i < n (nothing past n is read or written); returns their
// sum, added in 16 lanes in increasing i, then vec::sum.
inline float exp_shifted(float* w, int64_t n, float top) {
  f32x16 total = vec::zero();
  for (int64_t i = 0; i < n; i += 16) {
    const int live = static_cast<int>(std::min<int64_t>(n - i, 16));
    const f32x16 e = vec::keep_first(live, exp16(vec::sub(vec::load_first(live, w + i), vec::set1(top))));
    vec::store_first(live, w + i, e);
    total = vec::add(total, e);
  }
  return vec::sum(total);
}

// rows per task when row-wise work is split among threads (a row's result never depends on the split)
constexpr int64_t kRowGrain = 32;

// one row x (H,) -> out (H,), which may be x itself: out = weight * (x / sqrt(mean(x^2) + eps))
inline void rms_norm_row(const float* x, int64_t H, const float* weight, float eps, float* out) {
  const float inv = 1.0f / std::sqrt(dot(x, x, H) / static_cast<float>(H) + eps);
  for (int64_t h = 0; h < H; ++h) out[h] = weight[h] * (x[h] * inv);
}

// x (M, H) -> out (M, H): each row by rms_norm_row
void rms_norm(const float* x, int64_t M, int64_t H, const float* weight, float eps, float* out) {
  at::parallel_for(0, M, kRowGrain, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) rms_norm_row(x + m * H, H, weight, eps, out + m * H);
  });
}

// RoPE (rotate-half form) on the first rd (even, <= hd) of each of `heads` consecutive vectors of hd floats (rd < hd:
// the config rotates part of each head), one row's angles cr = cos, sr = sin (rd / 2,): dims d and d + rd / 2 turn
// by the same angle
void rope_heads(float* row, int64_t heads, int64_t hd, int64_t rd, const float* cr, const float* sr) {
  const int64_t half = rd / 2;
  for (int64_t head = 0; head < heads; ++head) {
    float* v = row + head * hd;
    float rotated[256];
    for (int64_t d = 0; d < half; ++d) {
      rotated[d] = v[d] * cr[d] + (-v[d + half]) * sr[d];
      rotated[d + half] = v[d + half] * cr[d] + v[d] * sr[d];
    }
    std::copy(rotated, rotated + rd, v);
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

// gu (M, 2I): gate then up for each row -> act (M, I) = gelu(gate) * up, GELU in PyTorch's tanh form:
// 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))) (Gemma's GeGLU)
void geglu(const float* gu, int64_t M, int64_t I, float* act) {
  const float k = 0.7978845608028654f;  // sqrt(2 / pi)
  at::parallel_for(0, M, kRowGrain, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t e = 0; e < I; ++e) {
        const float g = gu[i * 2 * I + e];
        const float gelu = 0.5f * g * (1.0f + std::tanh(k * (g + 0.044715f * g * g * g)));
        act[i * I + e] = gelu * gu[i * 2 * I + I + e];
      }
  });
}

// x (n,) in place: cap * tanh(x / cap) (Gemma 2's soft-capped scores and logits)
inline void soft_cap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = std::tanh(x[i] / cap) * cap;
}
