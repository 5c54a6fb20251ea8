// A model's shape and each decoder layer's weights, for the Llama family and the families that depart from it in
// small ways (Qwen3's q/k norms, sliding windows, Phi-3's partial RoPE, Gemma's sandwich norms, GeGLU, soft-capping
// and local RoPE tables): the differences are data here, read by the one forward in cpu_llama.cpp. Part of its
// translation unit.
#pragma once

struct Config {
  int64_t hidden, heads, kv_heads, head_dim, intermediate, layers, vocab;
  float eps;
  // family data (0: absent): the embeddings' scale, the attention scores' scale (0: 1 / sqrt(head_dim)), soft caps
  // of the scores and the final logits (x -> cap * tanh(x / cap)); gelu: GeGLU (tanh GELU) instead of SwiGLU
  float embed_scale = 0.0f, attn_scale = 0.0f, attn_softcap = 0.0f, logit_softcap = 0.0f;
  bool gelu = false;
};

// family: embed_scale, attn_scale, attn_softcap, logit_softcap, gelu (0 or 1), as Python's Family gives them
inline void read_family(Config& c, const std::vector<double>& family) {
  TORCH_CHECK(family.size() == 5, "family: embed_scale, attn_scale, attn_softcap, logit_softcap, gelu");
  c.embed_scale = static_cast<float>(family[0]);
  c.attn_scale = family[1] > 0 ? static_cast<float>(family[1]) : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  c.attn_softcap = static_cast<float>(family[2]);
  c.logit_softcap = static_cast<float>(family[3]);
  c.gelu = family[4] != 0;
}

struct Layer {
  torch::Tensor input_norm, post_norm;  // float32 (H,): before attention, before the MLP
  Weight qkv, o, gate_up, down;
  torch::Tensor qkv_bias, o_bias;  // float32 or undefined
  torch::Tensor q_norm, k_norm;  // float32 (head_dim,): an RMSNorm of each query and key head before RoPE, or undefined
  torch::Tensor attn_out_norm, mlp_out_norm;  // float32 (H,): norms of the attention's and the MLP's outputs, or
                                              // undefined
  int64_t window = 0;  // a sliding window: a query at position p sees keys at positions > p - window (0: all)
  bool local_rope = false;  // RoPE from the local tables (Gemma 3's windowed layers)
};

// per layer: input norm, qkv, qkv bias, o, o bias, post norm, gate_up, down, q norm, k norm, attention-output norm,
// MLP-output norm (biases and the last four may be empty)
constexpr int kLayerTensors = 12;

inline torch::Tensor optional_f32(const torch::Tensor& t) {
  return t.defined() && t.numel() ? t.contiguous().to(torch::kFloat32) : torch::Tensor();
}

Layer make_layer(const torch::Tensor* t, const Config& c, int64_t window, bool local_rope, bool pairs,
                 bool quantized) {
  auto weight = [&](const torch::Tensor& w) { return quantized ? make_quantized_weight(w, 4) : make_weight(w, pairs); };
  Layer layer;
  layer.input_norm = t[0].contiguous().to(torch::kFloat32);
  layer.qkv = weight(t[1]);
  layer.qkv_bias = optional_f32(t[2]);
  layer.o = weight(t[3]);
  layer.o_bias = optional_f32(t[4]);
  layer.post_norm = t[5].contiguous().to(torch::kFloat32);
  layer.gate_up = weight(t[6]);
  layer.down = weight(t[7]);
  layer.q_norm = optional_f32(t[8]);
  layer.k_norm = optional_f32(t[9]);
  layer.attn_out_norm = optional_f32(t[10]);
  layer.mlp_out_norm = optional_f32(t[11]);
  TORCH_CHECK(layer.q_norm.defined() == layer.k_norm.defined(), "q and k norms: both or neither");
  TORCH_CHECK(!layer.q_norm.defined() || (layer.q_norm.numel() == c.head_dim && layer.k_norm.numel() == c.head_dim),
              "q and k norms: (head_dim,)");
  TORCH_CHECK(layer.attn_out_norm.defined() == layer.mlp_out_norm.defined(), "output norms: both or neither");
  layer.window = window;
  layer.local_rope = local_rope;
  return layer;
}
