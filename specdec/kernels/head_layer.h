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
    const int64_t T = x_in.size(0), S = past_k.size(1);
    TORCH_CHECK(past_k.dim() == 3 && past_k.size(0) == nkv_ && past_k.size(2) == hd_ &&
                    past_v.sizes() == past_k.sizes(), "past keys and values must be (kv_heads, S, head_dim)");
    TORCH_CHECK(mask.numel() == 0 || (mask.dim() == 2 && mask.size(0) == T && mask.size(1) == S + T),
                "mask must be (T, S + T)");
    const torch::Tensor pk = heads_in_place(past_k), pv = heads_in_place(past_v);
    const torch::Tensor m = mask.numel() ? mask.contiguous().to(torch::kBool) : mask;
    const bool* seen = m.numel() ? m.data_ptr<bool>() : nullptr;
    return run(x_in, h_in, positions, [&](const float* kn, const float* vn) {
      std::vector<std::vector<KeyRef>> visible(T);  // the keys row t sees, in increasing order (all its heads')
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < S + T; ++j)
          if (seen ? seen[t * (S + T) + j] : j < S + t + 1)
            visible[t].push_back(j < S ? past_key(pk, pv, j) : new_key(kn, vn, T, j - S));
      return visible;
    });
  }

  // New pairs of several sequences in one call: counts[b] rows of sequence b, in order (rows of one sequence
  // consecutive, in position order), each seeing its sequence's past, past_k[b] and past_v[b] (nkv, S_b, hd), then
  // its sequence's new pairs up to its own. The same numbers, row by row, as forward over that sequence's rows alone
  // with that past (the products are batch-invariant): several requests' pairs in one call read the weights once.
  std::vector<torch::Tensor> forward_each(torch::Tensor x_in, torch::Tensor h_in, torch::Tensor positions,
                                          std::vector<torch::Tensor> past_k, std::vector<torch::Tensor> past_v,
                                          std::vector<int64_t> counts) const {
    const int64_t B = static_cast<int64_t>(counts.size()), T = x_in.size(0);
    TORCH_CHECK(static_cast<int64_t>(past_k.size()) == B && static_cast<int64_t>(past_v.size()) == B,
                "one past a sequence");
    TORCH_CHECK(std::accumulate(counts.begin(), counts.end(), int64_t{0}) == T &&
                    std::all_of(counts.begin(), counts.end(), [](int64_t n) { return n > 0; }),
                "counts must be positive and sum to the rows");
    std::vector<torch::Tensor> pk(B), pv(B);
    for (int64_t b = 0; b < B; ++b) {
      TORCH_CHECK(past_k[b].dim() == 3 && past_k[b].size(0) == nkv_ && past_k[b].size(2) == hd_ &&
                      past_v[b].sizes() == past_k[b].sizes(), "past keys and values must be (kv_heads, S, head_dim)");
      pk[b] = heads_in_place(past_k[b]), pv[b] = heads_in_place(past_v[b]);
    }
    return run(x_in, h_in, positions, [&](const float* kn, const float* vn) {
      std::vector<std::vector<KeyRef>> visible(T);
      for (int64_t b = 0, first = 0; b < B; first += counts[b], ++b)
        for (int64_t t = first; t < first + counts[b]; ++t) {
          for (int64_t j = 0; j < pk[b].size(1); ++j) visible[t].push_back(past_key(pk[b], pv[b], j));
          for (int64_t u = first; u <= t; ++u) visible[t].push_back(new_key(kn, vn, T, u));
        }
      return visible;
    });
  }

 private:
  // A key a row sees: its keys' and values' rows for KV head 0, and the elements from one KV head's row to the next's.
  struct KeyRef {
    const float *k, *v;
    int64_t k_head_stride, v_head_stride;
  };

  KeyRef past_key(const torch::Tensor& pk, const torch::Tensor& pv, int64_t j) const {
    return {pk.data_ptr<float>() + j * hd_, pv.data_ptr<float>() + j * hd_, pk.stride(0), pv.stride(0)};
  }

  // the new key of row u among T (kn, vn (nkv, T, hd))
  KeyRef new_key(const float* kn, const float* vn, int64_t T, int64_t u) const {
    return {kn + u * hd_, vn + u * hd_, T * hd_, T * hd_};
  }

  // The layer over T rows: norms, products and RoPE row by row; visible(kn, vn) lists the keys each row's attention
  // sees, given the new rows' keys and values (nkv, T, hd). Returns (x, keys, values) as forward's.
  template <typename Visible>
  std::vector<torch::Tensor> run(torch::Tensor x_in, torch::Tensor h_in, torch::Tensor positions,
                                 Visible visible) const {
    const int64_t T = x_in.size(0), qkv_width = qkv_.N;
    TORCH_CHECK(x_in.dim() == 2 && x_in.size(1) == H_, "x must be (T, hidden)");
    TORCH_CHECK(positions.numel() == T, "one position per row");
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
    torch::Tensor attn_t = torch::empty({T, nh_ * hd_}, f32);
    attend(qkv, qkv_width, visible(k_new.data_ptr<float>(), v_new.data_ptr<float>()), attn_t.data_ptr<float>());

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

  // out (T, nh * hd): each query head's softmax-weighted values over the keys its row sees, in the order listed
  void attend(const float* qkv, int64_t width, const std::vector<std::vector<KeyRef>>& visible, float* out) const {
    const int64_t groups = nh_ / nkv_, T = static_cast<int64_t>(visible.size());
    const float scale = 1.0f / std::sqrt(static_cast<float>(hd_));
    at::parallel_for(0, T * nh_, 1, [&](int64_t r0, int64_t r1) {
      std::vector<float> w;
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t t = r / nh_, head = r % nh_, g = head / groups;
        const float* q = qkv + t * width + head * hd_;
        const std::vector<KeyRef>& seen = visible[t];
        const int64_t n = static_cast<int64_t>(seen.size());
        w.resize(n);
        float top = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          w[i] = dot(q, seen[i].k + g * seen[i].k_head_stride, hd_) * scale;
          top = std::max(top, w[i]);
        }
        const float inv_total = 1.0f / exp_shifted(w.data(), n, top);
        float* o = out + t * nh_ * hd_ + head * hd_;
        for (int64_t d = 0; d < hd_; d += 16) {
          f32x16 acc = vec::zero();
          for (int64_t i = 0; i < n; ++i)
            acc = vec::fmadd(vec::set1(w[i]), vec::load(seen[i].v + g * seen[i].v_head_stride + d), acc);
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
