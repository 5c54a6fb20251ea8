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

// A weight from bytes already packed (a GGUF file's blocks, pack_codes), described by `packing`: (format, rows, inner
// size, bytes) for each of its row ranges in order; several ranges make a weight of parts (Weight::parts). Format 0:
// float32 values (a matrix of a type the kernels do not read, dequantized), packed here as make_weight packs them.
Weight weight_as_packed(const torch::Tensor& bytes, const std::vector<int64_t>& packing) {
  TORCH_CHECK(packing.size() % 4 == 0 && !packing.empty(), "packing: (format, rows, inner size, bytes) per part");
  std::vector<Weight> parts;
  std::vector<int64_t> offsets{0};
  int64_t at = 0;
  for (size_t i = 0; i < packing.size(); i += 4) {
    int64_t fmt = packing[i], N = packing[i + 1], K = packing[i + 2], size = packing[i + 3];
    // parts in one format whose rows fill whole blocks are one matrix of their blocks side by side: one product,
    // which the threads share in one go, instead of one per part
    while (fmt != 0 && N % kBlockCols == 0 && i + 4 < packing.size() && packing[i + 4] == fmt &&
           packing[i + 6] == K) {
      i += 4;
      N += packing[i + 1];
      size += packing[i + 3];
    }
    TORCH_CHECK(at + size <= bytes.numel(), "packing: parts beyond the bytes given");
    const torch::Tensor part = bytes.narrow(0, at, size);
    if (fmt == 0) {
      TORCH_CHECK(size == N * K * 4, "packing: a float32 part's bytes");
      parts.push_back(make_weight(part.view(torch::kFloat32).view({N, K})));
    } else {
      parts.push_back(packed_weight(part, static_cast<int>(fmt), N, K));
    }
    offsets.push_back(offsets.back() + N);
    at += size;
  }
  TORCH_CHECK(at == bytes.numel(), "packing: bytes left over");
  for (const Weight& p : parts) TORCH_CHECK(p.K == parts[0].K, "packing: parts of one inner size");
  if (parts.size() == 1) return parts[0];
  Weight w;
  w.N = offsets.back();
  w.K = parts[0].K;
  w.qbits = 0;
  w.parts = std::move(parts);
  w.offsets = std::move(offsets);
  return w;
}

Layer make_layer(const torch::Tensor* t, const Config& c, int64_t window, bool local_rope, bool pairs,
                 bool quantized, const std::vector<std::vector<int64_t>>& packing) {
  int slot = 0;  // the position of the tensor in the layer's list, for its packing
  auto weight = [&](const torch::Tensor& w) {
    const std::vector<int64_t>& p = packing[slot];
    if (!p.empty()) return weight_as_packed(w, p);
    return quantized ? make_quantized_weight(w, 4) : make_weight(w, pairs);
  };
  Layer layer;
  layer.input_norm = t[0].contiguous().to(torch::kFloat32);
  slot = 1;
  layer.qkv = weight(t[1]);
  layer.qkv_bias = optional_f32(t[2]);
  slot = 3;
  layer.o = weight(t[3]);
  layer.o_bias = optional_f32(t[4]);
  layer.post_norm = t[5].contiguous().to(torch::kFloat32);
  slot = 6;
  layer.gate_up = weight(t[6]);
  slot = 7;
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
