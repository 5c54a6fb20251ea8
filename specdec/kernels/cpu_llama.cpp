// specdec CPU kernels: a Llama-family forward pass (Qwen3's q/k norms and sliding windows included) whose results
// do not depend on batch shape.
//
// Every number is computed in float32 from weights stored in float32, bfloat16 or float16. Each output
// of a matrix product, each attention output and each norm is reduced in one fixed order that depends
// only on that output's own inputs: never on how many tokens are scored together, on which other
// sequences share the pass, or on how work is split among threads. So scoring k drafted tokens in one
// pass gives bit for bit what k one-token passes give, and speculation cannot change a single token.
//
// Reduction order of a matrix product's output: one float32 accumulator, over k = 0..K-1 in increasing order
// with fused multiply-adds (for bfloat16 products: over pairs of k, by vdpbf16ps, or by AMX tiles on CPUs that have
// them, chosen per machine and never per pass). Which of the two a pass uses
// is the caller's choice per pass (the Python side: bfloat16 for a sequence's first pass, or for every pass). Other dot products (norms,
// attention scores) use 16 lanes, lane l accumulating k = l (mod 16), then vec::sum.
//
// Built for AVX-512 where the CPU has it, otherwise for AVX2 (vec16.h carries 16 lanes in two registers there, with
// the same order of operations in every lane). bfloat16 products (vdpbf16ps, AMX) exist in AVX-512 builds only.
//
// One translation unit: products.h (the tiles), amx.h, quantized_layout.h, int8_lanes.h and quantized.h (quantized
// weights: a GGUF file's, a drafting copy's), drafting_head.h (the copy's LM head), weights.h (packing and
// linear()), row_ops.h (norms, RoPE, SwiGLU, softmax numerators), kv_cache.h, attention.h, attention_split.h (a
// drafting copy's), this file's model, head_layer.h (a drafter head's layer), and bindings.h (the Python module).

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <vector>

#include <immintrin.h>
#include <cpuid.h>
#include "vec16.h"
#include <sys/syscall.h>
#include <unistd.h>

namespace {

using vec::f32x16;

#ifdef __AVX512F__
#define SPECDEC_AVX512 1
#endif

#include "products.h"
#include "amx.h"
#include "quantized_layout.h"
#include "int8_lanes.h"
#include "quantized_steps.h"
#include "quantized_rows.h"
#include "quantized.h"
#include "drafting_head.h"
#include "weights.h"
#include "argmax_screen.h"
#include "row_ops.h"
#include "kv_cache.h"
#include "attention.h"
#include "attention_split.h"
#include "layers.h"

constexpr int kRescoredLogits = 16;  // a drafting copy's highest 4-bit logits per row, computed again in 8 bits

class CpuLlama {
 public:
  CpuLlama(std::vector<int64_t> dims, double eps, std::vector<torch::Tensor> layer_tensors, torch::Tensor embed,
           torch::Tensor final_norm, torch::Tensor lm_head, torch::Tensor cos, torch::Tensor sin,
           std::vector<int64_t> windows, std::vector<torch::Tensor> local_rope, std::vector<int64_t> local_layers,
           std::vector<double> family, bool pairs, bool quantized, bool screened,
           std::vector<std::vector<int64_t>> packed = {}) {
    TORCH_CHECK(dims.size() == 7, "dims: hidden, heads, kv_heads, head_dim, intermediate, layers, vocab");
    cfg_ = {dims[0], dims[1], dims[2], dims[3], dims[4], dims[5], dims[6], static_cast<float>(eps)};
    read_family(cfg_, family);
    TORCH_CHECK(cfg_.head_dim % 16 == 0 && cfg_.head_dim <= 256, "head_dim must be a multiple of 16, at most 256");
    TORCH_CHECK(cfg_.hidden % 16 == 0, "hidden size must be a multiple of 16");
    TORCH_CHECK(static_cast<int64_t>(layer_tensors.size()) == kLayerTensors * cfg_.layers, "12 tensors per layer");
    TORCH_CHECK(static_cast<int64_t>(windows.size()) == cfg_.layers && local_layers.size() == windows.size(),
                "a window and a RoPE table choice per layer");
    TORCH_CHECK(local_rope.empty() || local_rope.size() == 2, "local RoPE tables: none, or cos and sin");
    TORCH_CHECK(packed.empty() || static_cast<int64_t>(packed.size()) == kLayerTensors * cfg_.layers + 2,
                "packed: one description per layer tensor, then the embeddings' and the LM head's");
    auto packing = [&](int64_t i) { return packed.empty() ? std::vector<int64_t>{} : packed[i]; };
    for (int64_t l = 0; l < cfg_.layers; ++l) {
      TORCH_CHECK(!local_layers[l] || !local_rope.empty(), "a layer on local RoPE tables that are not given");
      std::vector<std::vector<int64_t>> layer_packing;
      for (int64_t i = 0; i < kLayerTensors; ++i) layer_packing.push_back(packing(kLayerTensors * l + i));
      layers_.push_back(make_layer(&layer_tensors[kLayerTensors * l], cfg_, windows[l], local_layers[l] != 0, pairs,
                                   quantized, layer_packing));
    }
    const std::vector<int64_t> embed_packing = packing(kLayerTensors * cfg_.layers);
    if (!embed_packing.empty()) {  // a quantized table: rows are widened as they are looked up
      embed_packed_ = weight_as_packed(embed, embed_packing);
      TORCH_CHECK(embed_packed_.parts.empty(), "quantized embeddings: one format");
    } else {
      embed_rows_ = embed.contiguous();
      embed_type_ = make_weight(embed.narrow(0, 0, 1).contiguous()).wtype;
    }
    const std::vector<int64_t> head_packing = packing(kLayerTensors * cfg_.layers + 1);
    if (!head_packing.empty()) {  // a quantized head is its own cheap copy: it is neither screened nor copied again
      lm_head_ = weight_as_packed(lm_head, head_packing);
    } else {
      lm_head_ = quantized ? make_quantized_weight(lm_head, 8) : make_weight(lm_head, pairs);
      if (quantized) lm_screen_ = make_quantized_weight(lm_head, 4);
      // a soft-capped head is not screened (tanh can round distinct logits to one value): no copy is kept for it
      if (screened && !quantized && cfg_.logit_softcap == 0.0f) argmax_screen_ = make_argmax_screen(lm_head);
    }
    final_norm_ = final_norm.contiguous().to(torch::kFloat32);
    cos_ = cos.contiguous().to(torch::kFloat32);
    sin_ = sin.contiguous().to(torch::kFloat32);
    rope_dims_ = 2 * cos_.size(1);  // the tables hold each angle once: rotate-half turns dims d and d + rd / 2 by it
    TORCH_CHECK(rope_dims_ <= cfg_.head_dim && sin_.size(1) == cos_.size(1),
                "RoPE tables: half the rotated dims' columns, at most head_dim / 2");
    if (!local_rope.empty()) {
      cos_local_ = local_rope[0].contiguous().to(torch::kFloat32);
      sin_local_ = local_rope[1].contiguous().to(torch::kFloat32);
      TORCH_CHECK(cos_local_.sizes() == cos_.sizes() && sin_local_.sizes() == cos_.sizes(),
                  "local RoPE tables: the global ones' shape");
    }
  }

  // ids (N,) int64: the new tokens of S sequences, concatenated; offsets (S+1,): sequence s owns tokens
  // [offsets[s], offsets[s+1]); slots (S,), starts (S,): its cache slot and cached length; positions (N,):
  // RoPE positions; masks: (S, T, T) uint8 with T = the longest sequence's new tokens (row t: which new
  // tokens token t sees), or an empty tensor for causal order; k_cache, v_cache: float32 or bfloat16 (L, slots,
  // kv_heads, P, head_dim), written at starts[s] + t, where within one (layer, slot, head) the keys are stored in
  // blocks of 16 positions as [P/16][head_dim][16] and the values as [P][head_dim] (kv_cache.h); logit_rows (R,)
  // int64: rows of the output that get logits.
  // num_layers > 0 runs only the first num_layers layers (an early exit, for self-speculation).
  // bf16_products: every matrix product of this pass in bfloat16 (weights packed in pairs only). A model built
  // `quantized` (4-bit layers, a screened LM head) is an approximate copy, for drafting: none of the above exactness
  // holds for it.
  // aux_layers (A,) int64: layers whose input (the residual stream before layer i, transformers'
  // hidden_states[i]) is returned too, for heads that read several depths (EAGLE-3); may be empty.
  // argmax_only: the caller reads each logit row's argmax only; a model built `screened` may return -inf where a
  // row's maximum cannot be (argmax_screen.h), the argmax and its logit exactly as without.
  // Returns (logits (R, V), hidden (N, H) after the final norm, aux (N, A * H)).
  // The caches hold float32 or bfloat16 (k and v alike): keys and values are rounded to it as they are written,
  // and every row reads them as written, so a row's result still depends only on the keys it sees.
  std::vector<torch::Tensor> forward(torch::Tensor ids, torch::Tensor offsets, torch::Tensor slots,
                                     torch::Tensor starts, torch::Tensor positions, torch::Tensor masks,
                                     torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor logit_rows,
                                     int64_t num_layers, bool bf16_products, torch::Tensor aux_layers,
                                     bool argmax_only) {
    const auto kv_type = k_cache.scalar_type();
    TORCH_CHECK((kv_type == torch::kFloat32 || kv_type == torch::kBFloat16) && v_cache.scalar_type() == kv_type,
                "k_cache and v_cache: both float32 or both bfloat16");
    TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "k_cache and v_cache must be contiguous");
    if (kv_type == torch::kBFloat16)
      return forward_on<uint16_t>(ids, offsets, slots, starts, positions, masks, k_cache, v_cache, logit_rows,
                                  num_layers, bf16_products, aux_layers, argmax_only);
    return forward_on<float>(ids, offsets, slots, starts, positions, masks, k_cache, v_cache, logit_rows, num_layers,
                             bf16_products, aux_layers, argmax_only);
  }

  template <typename KV>
  std::vector<torch::Tensor> forward_on(torch::Tensor ids, torch::Tensor offsets, torch::Tensor slots,
                                        torch::Tensor starts, torch::Tensor positions, torch::Tensor masks,
                                        torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor logit_rows,
                                        int64_t num_layers, bool bf16_products, torch::Tensor aux_layers,
                                        bool argmax_only) {
    const auto& c = cfg_;
    const int64_t N = ids.size(0), H = c.hidden, nh = c.heads, nkv = c.kv_heads, hd = c.head_dim;
    const int64_t I = c.intermediate, S = offsets.size(0) - 1;
    const int64_t qkv_width = (nh + 2 * nkv) * hd;
    TORCH_CHECK(k_cache.size(3) % 16 == 0, "cache capacity must be a multiple of 16");
    const int64_t P = k_cache.size(3);
    const int64_t slot_count = k_cache.size(1);
    const int64_t* id = ids.data_ptr<int64_t>();
    const int64_t* off = offsets.data_ptr<int64_t>();
    const int64_t* slot = slots.data_ptr<int64_t>();
    const int64_t* start = starts.data_ptr<int64_t>();
    const int64_t* pos = positions.data_ptr<int64_t>();
    const bool causal = masks.numel() == 0;
    const int64_t T = causal ? 0 : masks.size(1);
    const uint8_t* mask = causal ? nullptr : masks.data_ptr<uint8_t>();
    for (int64_t s = 0; s < S; ++s)
      TORCH_CHECK(start[s] + (off[s + 1] - off[s]) <= P, "sequence exceeds the KV cache capacity");

    auto f32 = torch::TensorOptions().dtype(torch::kFloat32);
    torch::Tensor x_t = torch::empty({N, H}, f32), h_t = torch::empty({N, H}, f32);
    torch::Tensor qkv_t = torch::empty({N, qkv_width}, f32), attn_t = torch::empty({N, nh * hd}, f32);
    torch::Tensor gu_t = torch::empty({N, 2 * I}, f32), act_t = torch::empty({N, I}, f32);
    float *x = x_t.data_ptr<float>(), *h = h_t.data_ptr<float>(), *qkv = qkv_t.data_ptr<float>();
    float *attn = attn_t.data_ptr<float>(), *gu = gu_t.data_ptr<float>(), *act = act_t.data_ptr<float>();
    const float* cos = cos_.data_ptr<float>();
    const float* sin = sin_.data_ptr<float>();

    // token -> sequence
    std::vector<int64_t> seq_of(N);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = off[s]; i < off[s + 1]; ++i) seq_of[i] = s;

    // embeddings, widened to float32
    const int64_t vocab_rows = embed_packed_.qbits ? embed_packed_.N : embed_rows_.size(0);
    for (int64_t i = 0; i < N; ++i) {
      TORCH_CHECK(id[i] >= 0 && id[i] < vocab_rows, "token id out of range");
      if (embed_packed_.qbits) {
        dequantized_row(embed_packed_.qfmt, reinterpret_cast<const uint8_t*>(embed_packed_.data), id[i], H, x + i * H);
      } else {
        const char* row = static_cast<const char*>(embed_rows_.data_ptr()) + id[i] * H * elem_size(embed_type_);
        for (int64_t k = 0; k < H; k += 16) vec::store(x + i * H + k, load16_any(row, k, embed_type_));
      }
      if (c.embed_scale != 0.0f)
        for (int64_t k = 0; k < H; ++k) x[i * H + k] *= c.embed_scale;
    }

    const int64_t layer_stride = slot_count * nkv * P * hd;
    const int64_t depth = num_layers > 0 ? std::min(num_layers, c.layers) : c.layers;
    const int64_t A = aux_layers.numel();
    const int64_t* aux_at = A ? aux_layers.data_ptr<int64_t>() : nullptr;
    for (int64_t j = 0; j < A; ++j)
      TORCH_CHECK(aux_at[j] >= 0 && aux_at[j] < depth, "aux layer out of range");
    torch::Tensor aux_t = torch::empty({N, A * H}, f32);
    float* aux = aux_t.data_ptr<float>();
    // a drafting copy's sequences of one or two tokens split their keys among threads (attention_split.h)
    // (not in windowed layers, whose rows see fewer keys than that split assumes)
    const std::vector<uint8_t> split = lm_screen_.qbits && causal ? split_sequences(S, off, nh / nkv)
                                                                   : std::vector<uint8_t>(S, 0);
    const std::vector<uint8_t> no_split(S, 0);
    for (int64_t l = 0; l < depth; ++l) {
      const Layer& L = layers_[l];
      for (int64_t j = 0; j < A; ++j)
        if (aux_at[j] == l)
          for (int64_t i = 0; i < N; ++i) std::copy(x + i * H, x + (i + 1) * H, aux + (i * A + j) * H);
      KV* kc = static_cast<KV*>(k_cache.data_ptr()) + l * layer_stride;
      KV* vc = static_cast<KV*>(v_cache.data_ptr()) + l * layer_stride;
      rms_norm(x, N, H, L.input_norm.data_ptr<float>(), c.eps, h);
      linear(h, N, L.qkv, L.qkv_bias.defined() ? L.qkv_bias.data_ptr<float>() : nullptr, qkv, qkv_width, bf16_products);
      // RoPE on q and k, then k and v into the cache (each row writes its own cache entries)
      at::parallel_for(0, N, kRowGrain, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        float* row = qkv + i * qkv_width;
        if (L.q_norm.defined()) {
          for (int64_t head = 0; head < nh; ++head)
            rms_norm_row(row + head * hd, hd, L.q_norm.data_ptr<float>(), c.eps, row + head * hd);
          for (int64_t head = nh; head < nh + nkv; ++head)
            rms_norm_row(row + head * hd, hd, L.k_norm.data_ptr<float>(), c.eps, row + head * hd);
        }
        const float* ct = L.local_rope ? cos_local_.data_ptr<float>() : cos;
        const float* st = L.local_rope ? sin_local_.data_ptr<float>() : sin;
        rope_heads(row, nh + nkv, hd, rope_dims_, ct + pos[i] * rope_dims_ / 2, st + pos[i] * rope_dims_ / 2);
        const int64_t s = seq_of[i];
        const int64_t at = start[s] + (i - off[s]);
        for (int64_t g = 0; g < nkv; ++g) {
          // keys: blocks of 16 positions, transposed: [P/16][hd][16]
          KV* kb = kc + (slot[s] * nkv + g) * P * hd + (at / 16) * hd * 16 + at % 16;
          const float* src = row + (nh + g) * hd;
          for (int64_t d = 0; d < hd; ++d) kb[d * 16] = to_kv<KV>(src[d]);
          const float* value = row + (nh + nkv + g) * hd;
          KV* vb = vc + ((slot[s] * nkv + g) * P + at) * hd;
          for (int64_t d = 0; d < hd; ++d) vb[d] = to_kv<KV>(value[d]);
        }
      }
      });
      const std::vector<uint8_t>& layer_split = L.window || c.attn_softcap != 0.0f ? no_split : split;
      const AttentionShape shape{c.attn_scale, c.attn_softcap, L.window, pos};
      attention(nh, nkv, hd, qkv, qkv_width, kc, vc, P, S, off, slot, start, causal, T, mask, attn, shape,
                &layer_split);
      attention_split_keys(nh, nkv, hd, qkv, qkv_width, kc, vc, P, S, off, slot, start, attn, layer_split,
                           c.attn_scale);
      linear(attn, N, L.o, L.o_bias.defined() ? L.o_bias.data_ptr<float>() : nullptr, h, H, bf16_products);
      if (L.attn_out_norm.defined()) rms_norm(h, N, H, L.attn_out_norm.data_ptr<float>(), c.eps, h);
      for (int64_t e = 0; e < N * H; ++e) x[e] += h[e];
      rms_norm(x, N, H, L.post_norm.data_ptr<float>(), c.eps, h);
      linear(h, N, L.gate_up, nullptr, gu, 2 * I, bf16_products);
      if (c.gelu) geglu(gu, N, I, act);
      else swiglu(gu, N, I, act);
      linear(act, N, L.down, nullptr, h, H, bf16_products);
      if (L.mlp_out_norm.defined()) rms_norm(h, N, H, L.mlp_out_norm.data_ptr<float>(), c.eps, h);
      for (int64_t e = 0; e < N * H; ++e) x[e] += h[e];
    }
    rms_norm(x, N, H, final_norm_.data_ptr<float>(), c.eps, h);
    const int64_t R = logit_rows.size(0);
    const int64_t* rows = logit_rows.data_ptr<int64_t>();
    torch::Tensor picked = torch::empty({R, H}, f32);
    for (int64_t r = 0; r < R; ++r) std::copy(h + rows[r] * H, h + (rows[r] + 1) * H, picked.data_ptr<float>() + r * H);
    torch::Tensor logits = torch::empty({R, lm_head_.N}, f32);
    if (lm_screen_.qbits)
      screened_logits(picked.data_ptr<float>(), R, reinterpret_cast<const uint8_t*>(lm_screen_.data),
                      reinterpret_cast<const uint8_t*>(lm_head_.data), lm_head_.N, H, kRescoredLogits,
                      logits.data_ptr<float>());
    else if (argmax_only && argmax_screen_.ready && R <= kScreenedRows && !bf16_products)
      screened_argmax_logits(argmax_screen_, lm_head_, picked.data_ptr<float>(), R, logits.data_ptr<float>());
    else
      linear(picked.data_ptr<float>(), R, lm_head_, nullptr, logits.data_ptr<float>(), lm_head_.N, bf16_products);
    if (c.logit_softcap != 0.0f) soft_cap(logits.data_ptr<float>(), logits.numel(), c.logit_softcap);
    return {logits, h_t, aux_t};
  }

  // Moves cache entries start + keep[i] to start + i in one slot (tree path compaction), all layers and heads.
  void compact(torch::Tensor k_cache, torch::Tensor v_cache, int64_t slot, int64_t start, std::vector<int64_t> keep) {
    const int64_t L = k_cache.size(0), slots = k_cache.size(1), P = k_cache.size(3);
    if (k_cache.scalar_type() == torch::kBFloat16)
      return compact_entries(static_cast<uint16_t*>(k_cache.data_ptr()), static_cast<uint16_t*>(v_cache.data_ptr()),
                             L, slots, cfg_.kv_heads, P, cfg_.head_dim, slot, start, keep);
    compact_entries(k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), L, slots, cfg_.kv_heads, P, cfg_.head_dim,
                    slot, start, keep);
  }

  // whether passes asked for argmaxes only read the 8-bit copy of the LM head (argmax_screen.h)
  bool screened() const { return argmax_screen_.ready; }

  // y = x @ w^T with the same kernel (for drafter heads and tests): x (M, K) float32, w (N, K).
  static torch::Tensor matmul(torch::Tensor x, torch::Tensor w) { return product(x, make_weight(w.contiguous())); }

 private:
  Config cfg_;
  std::vector<Layer> layers_;
  torch::Tensor embed_rows_;  // (V, H) as given, for lookups
  int embed_type_ = F32;
  Weight embed_packed_;  // or the table in a quantized format (GGUF files), rows widened as they are looked up
  Weight lm_head_;
  Weight lm_screen_;  // a drafting copy's 4-bit LM head, which screens the outputs its 8-bit one rescores
  ArgmaxScreen argmax_screen_;  // the target's 8-bit copy of its LM head, for passes that need argmaxes only
  torch::Tensor final_norm_, cos_, sin_;  // cos_, sin_: (positions, rope_dims_ / 2)
  torch::Tensor cos_local_, sin_local_;  // the windowed layers' own tables (Gemma 3), or undefined
  int64_t rope_dims_ = 0;  // the head dims RoPE turns: head_dim, or its first part
};

#include "head_layer.h"

}  // namespace

#include "bindings.h"
