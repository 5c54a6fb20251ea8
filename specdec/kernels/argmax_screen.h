// The LM head's argmax, exactly, for about half its bytes: greedy decoding and greedy verification read nothing of
// a row's logits but its argmax (the first of equal maxima), and the LM head is a quarter of a small model's bytes
// (Qwen3-0.6B: 311 of 1,192 MB in bfloat16). The head is kept a second time at 8 bits (quantized.h's Q8_0 groups).
// A pass scores every output from those, bounds how far each 8-bit value a_n can be from the float32 value l_n the
// full product gives, and computes again, exactly as the full product does, only the outputs whose upper bound
// reaches the best lower bound. Every other output is certainly below the row's maximum, so the row's argmax is the
// full product's; its logit is set to -inf. Part of cpu_llama.cpp's translation unit, included after weights.h.
//
// The bound, for output n and a row x (real arithmetic; q_n and xq are the 8-bit weights and activations as numbers):
//   |l_n - a_n| <= ||x|| (g_K ||w_n|| + ||w_n - q_n||) + ||q_n|| (||x - xq|| + g_G1 ||xq||)
// - l_n is K fused multiply-adds from 0 in one order (products.h): |l_n - w_n.x| <= g_K sum|w x| <= g_K ||w_n|| ||x||;
// - |w_n.x - q_n.xq| <= ||w_n - q_n|| ||x|| + ||q_n|| ||x - xq|| (Cauchy-Schwarz);
// - a_n is exact integer sums of G = K/32 groups, each times one rounded scale product and added by one fused
//   multiply-add: |a_n - q_n.xq| <= g_(G+1) sum|q xq| <= g_(G+1) ||q_n|| ||xq||;
// - g_m = m u / (1 - m u), u = 2^-24, taken twice over; an absolute 1e-30 covers underflow.
#pragma once

// Rows a pass screens at most: one (a decoding step, a prefill's last row). A pass over more rows runs the full head:
// there the 8-bit products' arithmetic (pairs of u8 x s8 products summed in 16 and 32 bits) costs more than the bytes
// they save. Measured on a Zen 3 (AVX2, no VNNI), smollm2-135m, bfloat16: a one-row pass 8.04 ms screened against
// 8.50 ms full, two rows 10.59 against 10.83, four 12.10 against 11.86, six 17.43 against 13.08.
constexpr int64_t kScreenedRows = 1;

struct ArgmaxScreen {
  Weight q8;  // the head at 8 bits (quantized.h)
  torch::Tensor rows;  // (N, K) the head as the model holds it: float32, bfloat16 or float16
  int wtype = F32;
  std::vector<float> on_x, on_q;  // per output, rounded up: g_K ||w_n|| + ||w_n - q_n||, and ||q_n||
  double most_on_x = 0, most_on_q = 0;  // their maxima over the outputs
  bool ready = false;  // false: no screen (K not a multiple of 32, or weights that are not finite)
};

inline float head_weight(const void* rows, int64_t at, int wtype) {
  if (wtype == F32) return static_cast<const float*>(rows)[at];
  const uint16_t bits = static_cast<const uint16_t*>(rows)[at];
  if (wtype == F16) return _cvtsh_ss(bits);
  uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &wide, sizeof(out));
  return out;
}

inline double error_factor(int64_t m) {
  const double u = std::ldexp(1.0, -24);
  return 2.0 * m * u / (1.0 - m * u);
}

inline float rounded_up(double v) { return std::nextafter(static_cast<float>(v), INFINITY); }

ArgmaxScreen make_argmax_screen(const torch::Tensor& head) {
  ArgmaxScreen s;
  const int64_t N = head.size(0), K = head.size(1);
  if (K % kQGroup) return s;
  s.rows = head.contiguous();
  s.wtype = make_weight(s.rows.narrow(0, 0, 1).contiguous()).wtype;
  s.q8 = make_quantized_weight(s.rows, 8);
  s.on_x.assign(N, 0.f);
  s.on_q.assign(N, 0.f);
  const int64_t G = K / kQGroup, blocks = (N + kBlockCols - 1) / kBlockCols;
  const double gK = error_factor(K);
  // q_n read back from the packed bytes: the numbers the 8-bit products use. In float64, 64 blocks at a time: every
  // product d * q and w itself are exact there.
  const int64_t block_bytes = G * q_group_bytes(8);
  constexpr int64_t kBlocksAtOnce = 64;
  for (int64_t b0 = 0; b0 < blocks; b0 += kBlocksAtOnce) {
    const int64_t nb = std::min(kBlocksAtOnce, blocks - b0), n0 = b0 * kBlockCols;
    const int64_t rows = std::min(nb * kBlockCols, N - n0);
    const auto [q, d] = unpack_q8(s.q8.tensor.narrow(0, b0 * block_bytes, nb * block_bytes), nb, G);
    const torch::Tensor qw = (q.to(torch::kFloat64) * d.to(torch::kFloat64).unsqueeze(-1))
                                 .reshape({nb * kBlockCols, K}).narrow(0, 0, rows);
    const torch::Tensor w = s.rows.narrow(0, n0, rows).to(torch::kFloat64);
    const torch::Tensor on_x = ((gK * w.norm(2, 1) + (w - qw).norm(2, 1)) * (1 + 1e-6)).contiguous();
    const torch::Tensor on_q = (qw.norm(2, 1) * (1 + 1e-6)).contiguous();
    for (int64_t r = 0; r < rows; ++r) {
      s.on_x[n0 + r] = rounded_up(on_x.data_ptr<double>()[r]);
      s.on_q[n0 + r] = rounded_up(on_q.data_ptr<double>()[r]);
    }
  }
  for (int64_t n = 0; n < N; ++n) {
    if (!std::isfinite(s.on_x[n]) || !std::isfinite(s.on_q[n])) return ArgmaxScreen{};
    s.most_on_x = std::max<double>(s.most_on_x, s.on_x[n]), s.most_on_q = std::max<double>(s.most_on_q, s.on_q[n]);
  }
  s.ready = true;
  return s;
}

// Output n of the full product for one row x, as its tile computes it: one accumulator from 0, k in increasing
// order, fused multiply-adds, then + 0 (the tile's absent bias).
inline float exact_head_output(const ArgmaxScreen& s, const float* x, int64_t n) {
  const int64_t K = s.rows.size(1);
  const void* rows = s.rows.data_ptr();
  float acc = 0.f;
  for (int64_t k = 0; k < K; ++k) acc = std::fma(head_weight(rows, n * K + k, s.wtype), x[k], acc);
  return acc + 0.f;
}

// The first position of the largest of y[n0, n1) (finite values): the largest by vectors, then where it first is.
inline int64_t first_max(const float* y, int64_t n0, int64_t n1) {
  float best = -INFINITY;
  int64_t n = n0;
  if (n1 - n0 >= 16) {
    f32x16 most = vec::load(y + n0);
    for (n = n0 + 16; n + 16 <= n1; n += 16) most = vec::max(most, vec::load(y + n));
    float lanes[16];
    vec::store(lanes, most);
    for (float lane : lanes) best = std::max(best, lane);
  }
  for (; n < n1; ++n) best = std::max(best, y[n]);
  for (n = n0; n < n1 - 1 && y[n] != best; ++n) {}
  return n;
}

// y (R, N): for each row of x (R, K), -inf except where the row's maximum may be, those outputs exactly the full
// product's (linear() with `full`, float32 products). A row the screen cannot narrow (candidates beyond 1/64 of
// the outputs, or activations that are not finite) gets the full product instead.
// The best 8-bit output n0 gives the floor: the row's maximum is at least l_n0 >= a_n0 - bound_n0. An output is a
// candidate when a_n + bound_n reaches it; one float comparison with the widest bound rules out almost all first.
// The scans over the outputs are shared among the threads in kPieces pieces, combined in order.
void screened_argmax_logits(const ArgmaxScreen& s, const Weight& full, const float* x, int64_t R, float* y) {
  constexpr int64_t kPieces = 64;
  const int64_t N = s.q8.N, K = s.q8.K, G = K / kQGroup;
  const int64_t piece = (N + kPieces - 1) / kPieces;
  const Q8Rows xq = quantize_rows(x, R, K);
  linear_quantized<8>(xq, R, reinterpret_cast<const uint8_t*>(s.q8.data), N, K, nullptr, y, N);
  const double gG = error_factor(G + 1);
  const int64_t most = std::max<int64_t>(64, N / 64);
  std::vector<int64_t> bests(kPieces);
  std::vector<std::vector<int64_t>> picks(kPieces);
  for (int64_t r = 0; r < R; ++r) {
    const float* xr = x + r * K;
    float* yr = y + r * N;
    double xx = 0, qq = 0, ee = 0;
    for (int64_t k = 0; k < K; ++k) {
      const double xk = xr[k], xh = static_cast<double>(xq.scale[r * G + k / kQGroup]) * xq.q[r * K + k];
      xx += xk * xk, qq += xh * xh, ee += (xk - xh) * (xk - xh);
    }
    const double on_x = std::sqrt(xx), on_q = std::sqrt(ee) + gG * std::sqrt(qq);
    auto bound = [&](int64_t n) { return (s.on_x[n] * on_x + s.on_q[n] * on_q) * (1 + 1e-6) + 1e-30; };
    bool narrowed = std::isfinite(xx) && std::isfinite(ee);
    if (narrowed) {
      at::parallel_for(0, kPieces, 1, [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p)
          bests[p] = first_max(yr, std::min(N, p * piece), std::min(N, (p + 1) * piece));
      });
      int64_t n0 = bests[0];
      for (int64_t p = 1; p < kPieces; ++p)
        if (bests[p] < N && yr[bests[p]] > yr[n0]) n0 = bests[p];
      const double floor = yr[n0] - bound(n0);
      const double widest = (s.most_on_x * on_x + s.most_on_q * on_q) * (1 + 1e-6) + 1e-30;
      const float cut = std::nextafter(static_cast<float>(floor - widest), -INFINITY);  // <= floor - any bound
      narrowed = std::isfinite(floor) && std::isfinite(cut);
      if (narrowed) {
        at::parallel_for(0, kPieces, 1, [&](int64_t p0, int64_t p1) {
          for (int64_t p = p0; p < p1; ++p) {
            picks[p].clear();
            const int64_t end = std::min(N, (p + 1) * piece);
            for (int64_t n = std::min(N, p * piece); n < end && static_cast<int64_t>(picks[p].size()) <= most; ++n)
              if (yr[n] >= cut && yr[n] + bound(n) >= floor) picks[p].push_back(n);
          }
        });
        int64_t picked = 0;
        for (const auto& part : picks) picked += part.size();
        narrowed = picked <= most;
      }
    }
    if (!narrowed) {
      linear(xr, 1, full, nullptr, yr, N);
      continue;
    }
    std::vector<std::pair<int64_t, float>> exact;
    for (const auto& part : picks)
      for (int64_t n : part) exact.emplace_back(n, exact_head_output(s, xr, n));
    std::fill(yr, yr + N, -INFINITY);
    for (const auto& [n, value] : exact) yr[n] = value;
  }
}
