// The drafting copy's LM head (kernels/cpu_llama.cpp's `quantized` model): 4-bit weights, w = d * u + m with u in
// 0..15 (Q4_1), score every output; 8-bit ones, w = d * q with q in -127..127 (Q8_0), compute each row's highest
// again, and those decide the drafts. A one-token pass of the copy reads about a third of bfloat16's bytes: a cheap,
// approximate copy of the target, whose own passes never use it. Part of cpu_llama.cpp's translation unit, included
// after quantized.h.
#pragma once

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
