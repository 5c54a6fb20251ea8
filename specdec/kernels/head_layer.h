// The decoder layer of a drafter head (EAGLE, EAGLE-3) as one native call: the drafter runs it once per tree
// level, on a few rows, where dozens of small torch operations used to cost more than the products themselves.
//
// Part of cpu_llama.cpp's translation unit (included after the products, norms and exp16 it uses). Drafting only
// decides what is proposed, never what is accepted, so these numbers need not match the torch head's bit for bit;
// each row's result still depends on nothing but its own inputs and the keys it sees.
#pragma once

// x (T, H) float32: the residual stream; h (T, A): the attention's input (empty: x after the input norm, or x
// itself without one); positions (T,) int64; past_k, past_v (nkv, S, hd) float32: the keys and values of earlier
// pairs (S may be 0); mask (T, S + T) bool, true where a row sees a key, or empty: every past key and the new ones
// up to its own. bf16_dot: bfloat16 weights multiplied in bfloat16 (AVX-512 BF16 builds), as PackedLinear's.
// Returns (x (T, H) after attention and the MLP, keys (nkv, T, hd) after RoPE, values (nkv, T, hd)).
class HeadLayer {
 public:
  HeadLayer(std::vector<int64_t> dims, double eps, torch::Tensor input_norm, torch::Tensor qkv, torch::Tensor o,
            torch::Tensor post_norm, torch::Tensor gate_up, torch::Tensor down, torch::Tensor inv_freq, bool bf16_dot,
            int64_t bits = 0)
      : qkv_(float_or_quantized(qkv, bf16_dot, bits)), o_(float_or_quantized(o, bf16_dot, bits)),
        gate_up_(float_or_quantized(gate_up, bf16_dot, bits)), down_(float_or_quantized(down, bf16_dot, bits)),
        bf16_dot_(bf16_dot && qkv_.pairs) {
    TORCH_CHECK(dims.size() == 5, "dims: hidden, heads, kv_heads, head_dim, intermediate");
    H_ = dims[0], nh_ = dims[1], nkv_ = dims[2], hd_ = dims[3], I_ = dims[4];
    eps_ = static_cast<float>(eps);
    TORCH_CHECK(hd_ % 16 == 0 && hd_ <= 256 && nh_ % nkv_ == 0 && H_ % 16 == 0 && I_ % 16 == 0,
                "unsupported head shape");
    TORCH_CHECK(qkv_.N == (nh_ + 2 * nkv_) * hd_ && o_.N == H_ && gate_up_.N == 2 * I_ && down_.N == H_,
                "weights do not match the dims");
    if (input_norm.defined() && input_norm.numel()) input_norm_ = input_norm.contiguous().to(torch::kFloat32);
    post_norm_ = post_norm.contiguous().to(torch::kFloat32);
    inv_freq_ = inv_freq.contiguous().to(torch::kFloat32);
    TORCH_CHECK(inv_freq_.numel() == hd_ / 2, "inv_freq must hold head_dim / 2 frequencies");
  }

  std::vector<torch::Tensor> forward(torch::Tensor x_in, torch::Tensor h_in, torch::Tensor positions,
                                     torch::Tensor past_k, torch::Tensor past_v, torch::Tensor mask) const {
    const int64_t T = x_in.size(0), S = past_k.size(1), qkv_width = qkv_.N;
    TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == H_, "x must be (T, hidden)");
    TORCH_CHECK(positions.numel() == T, "one position per row");
    TORCH_CHECK(past_k.dim() == 3 && past_k.size(0) == nkv_ && past_k.size(2) == hd_ &&
                    past_v.sizes() == past_k.sizes(), "past keys and values must be (kv_heads, S, head_dim)");
    TORCH_CHECK(mask.numel() == 0 || (mask.dim() == 2 && mask.size(0) == T && mask.size(1) == S + T),
                "mask must be (T, S + T)");
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor x_t = x_in.contiguous().to(torch::kFloat32).clone();
    torch::Tensor h_t;
    if (h_in.numel()) {
      h_t = h_in.contiguous().to(torch::kFloat32);
    } else if (input_norm_.defined()) {
      h_t = torch::empty({T, H_}, f32);
      rms_norm(x_t.data_ptr<float>(), T, H_, input_norm_.data_ptr<float>(), eps_, h_t.data_ptr<float>());
    } else {
      h_t = x_t;
    }
    TORCH_CHECK(h_t.size(0) == T && h_t.size(1) == qkv_.K, "the attention input's width does not match q/k/v");
    torch::Tensor qkv_t = torch::empty({T, qkv_width}, f32);
    linear(h_t.data_ptr<float>(), T, qkv_, nullptr, qkv_t.data_ptr<float>(), qkv_width, bf16_dot_);
    float* qkv = qkv_t.data_ptr<float>();
    rope(qkv, qkv_width, positions.contiguous().to(torch::kInt64).data_ptr<int64_t>(), T);

    torch::Tensor k_new = torch::empty({nkv_, T, hd_}, f32), v_new = torch::empty({nkv_, T, hd_}, f32);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t g = 0; g < nkv_; ++g) {
        const float* row = qkv + t * qkv_width;
        std::copy(row + (nh_ + g) * hd_, row + (nh_ + g + 1) * hd_, k_new.data_ptr<float>() + (g * T + t) * hd_);
        std::copy(row + (nh_ + nkv_ + g) * hd_, row + (nh_ + nkv_ + g + 1) * hd_,
                  v_new.data_ptr<float>() + (g * T + t) * hd_);
      }
    const torch::Tensor pk = heads_in_place(past_k), pv = heads_in_place(past_v);
    const torch::Tensor m = mask.numel() ? mask.contiguous().to(torch::kBool) : mask;
    torch::Tensor attn_t = torch::empty({T, nh_ * hd_}, f32);
    attend(qkv, qkv_width, {pk.data_ptr<float>(), pk.stride(0)}, {pv.data_ptr<float>(), pv.stride(0)}, S,
           k_new.data_ptr<float>(), v_new.data_ptr<float>(), T, m.numel() ? m.data_ptr<bool>() : nullptr,
           attn_t.data_ptr<float>());

    float* x = x_t.data_ptr<float>();
    torch::Tensor y_t = torch::empty({T, H_}, f32), gu_t = torch::empty({T, 2 * I_}, f32);
    torch::Tensor act_t = torch::empty({T, I_}, f32);
    float *y = y_t.data_ptr<float>(), *gu = gu_t.data_ptr<float>(), *act = act_t.data_ptr<float>();
    linear(attn_t.data_ptr<float>(), T, o_, nullptr, y, H_, bf16_dot_);
    for (int64_t e = 0; e < T * H_; ++e) x[e] += y[e];
    rms_norm(x, T, H_, post_norm_.data_ptr<float>(), eps_, y);
    linear(y, T, gate_up_, nullptr, gu, 2 * I_, bf16_dot_);
    swiglu(gu, T, I_, act);
    linear(act, T, down_, nullptr, y, H_, bf16_dot_);
    for (int64_t e = 0; e < T * H_; ++e) x[e] += y[e];
    return {x_t, k_new, v_new};
  }

 private:
  // RoPE on each row's q and k heads, angles position * inv_freq (float32, as the torch head computes them)
  void rope(float* qkv, int64_t width, const int64_t* pos, int64_t T) const {
    const int64_t half = hd_ / 2;
    const float* inv = inv_freq_.data_ptr<float>();
    std::vector<float> cs(half), sn(half);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t d = 0; d < half; ++d) {
        const float angle = static_cast<float>(pos[t]) * inv[d];
        cs[d] = std::cos(angle);
        sn[d] = std::sin(angle);
      }
      rope_heads(qkv + t * width, nh_ + nkv_, hd_, hd_, cs.data(), sn.data());
    }
  }

  // Past keys or values (nkv, S, hd) float32 as they are where each head's S rows are contiguous (the first S rows of
  // a drafter's longer buffer, (nkv, capacity, hd)), else a contiguous copy: a drafting step reads the past in place
  // instead of copying all of it.
  static torch::Tensor heads_in_place(const torch::Tensor& past) {
    if (past.scalar_type() == torch::kFloat32 && past.stride(2) == 1 && past.stride(1) == past.size(2)) return past;
    return past.contiguous().to(torch::kFloat32);
  }

  struct PastRows {
    const float* data;
    int64_t head_stride;  // elements from one kv head's rows to the next's
  };

  // out (T, nh * hd): each query head's softmax-weighted values over the keys its row sees, past then new
  void attend(const float* qkv, int64_t width, PastRows pk, PastRows pv, int64_t S, const float* kn, const float* vn,
              int64_t T, const bool* mask, float* out) const {
    const int64_t groups = nh_ / nkv_, keys = S + T;
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    std::vector<std::vector<int64_t>> visible(T);  // the keys row t sees, in increasing order (all its heads')
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < keys; ++j)
        if (mask ? mask[t * keys + j] : j < S + t + 1) visible[t].push_back(j);
    at::parallel_for(0, T * nh_, 1, [&](int64_t r0, int64_t r1) {
      std::vector<float> w(keys);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / nh_, head = r % nh_, g = head / groups;
        const float* q = qkv + t * width + head * hd_;
        const std::vector<int64_t>& seen = visible[t];
        const int64_t n = static_cast<int64_t>(seen.size());
        float top = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          const int64_t j = seen[i];
          const float* k = j < S ? pk.data + g * pk.head_stride + j * hd_ : kn + (g * T + j - S) * hd_;
          w[i] = dot(q, k, hd_) * scale;
          top = std::max(top, w[i]);
        }
        const float inv_total = 1.0f / exp_shifted(w.data(), n, top);
        float* o = out + t * nh_ * hd_ + head * hd_;
        for (int64_t d = 0; d < hd_; d += 16) {
          f32x16 acc = vec::zero();
          for (int64_t i = 0; i < n; ++i) {
            const int64_t j = seen[i];
            const float* v = j < S ? pv.data + g * pv.head_stride + j * hd_ : vn + (g * T + j - S) * hd_;
            acc = vec::fmadd(vec::set1(w[i]), vec::load(v + d), acc);
          }
          vec::store(o + d, vec::mul(acc, vec::set1(inv_total)));
        }
      }
    });
  }

  Weight qkv_, o_, gate_up_, down_;
  bool bf16_dot_;
  torch::Tensor input_norm_, post_norm_, inv_freq_;
  int64_t H_ = 0, nh_ = 0, nkv_ = 0, hd_ = 0, I_ = 0;
  float eps_ = 0.0f;
};
