// Weights packed once for the kernels, and the one entry point of every matrix product: linear(), which picks
// the float32, bfloat16 or AMX products for a weight and a pass. Part of cpu_llama.cpp's translation unit,
// included after products.h and amx.h.
#pragma once

// (N, K) row-major -> packed blocks of 64 rows (see kBlockCols), as a flat tensor of the same dtype
torch::Tensor pack_blocks(const torch::Tensor& w, bool pairs) {
  const int64_t N = w.size(0), K = w.size(1);
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  torch::Tensor padded = torch::zeros({blocks * kBlockCols, K}, w.options());
  padded.narrow(0, 0, N).copy_(w);
  if (pairs)  // (blocks, 64, K/2, 2) -> (blocks, K/2, 64, 2)
    return padded.view({blocks, kBlockCols, K / 2, 2}).permute({0, 2, 1, 3}).contiguous().view({-1});
#ifdef SPECDEC_AVX512
  // (blocks, 64, K) -> (blocks, K, 64)
  return padded.view({blocks, kBlockCols, K}).permute({0, 2, 1}).contiguous().view({-1});
#else
  // (blocks, 64, K) -> (blocks, 4, K, 16)
  return padded.view({blocks, kVecs, 16, K}).permute({0, 1, 3, 2}).contiguous().view({-1});
#endif
}

struct Weight {
  torch::Tensor tensor;  // packed blocks, kept alive here
  const char* data = nullptr;
  int64_t N = 0, K = 0;
  int wtype = F32;  // the stored type: F32, BF16 or F16
  bool pairs = false;  // bfloat16 packed in pairs of k: products in float32 (BF16PAIRS) or bfloat16 (BF16DOT)
  int qbits = 0;  // 4 or 8: quantized groups (quantized.h), products of activations rounded to int8
  int qfmt = 0;  // the quantized format (QFormat) where qbits
  // a weight made of row ranges in different formats (a GGUF file's q, k and v, fused): parts[i] gives outputs
  // [offsets[i], offsets[i + 1]); the parts' own fields above are unused
  std::vector<Weight> parts;
  std::vector<int64_t> offsets;
};

// pairs: pack bfloat16 weights for both kinds of product (a no-op for other dtypes)
Weight make_weight(const torch::Tensor& t, bool pairs = false) {
  TORCH_CHECK(t.dim() == 2 && t.is_contiguous() && t.device().is_cpu(), "weights must be contiguous 2-D CPU tensors");
  TORCH_CHECK(t.size(1) % 16 == 0, "the kernels need inner sizes that are multiples of 16");
  Weight w;
  w.N = t.size(0);
  w.K = t.size(1);
  if (t.scalar_type() == torch::kFloat32) w.wtype = F32;
  else if (t.scalar_type() == torch::kBFloat16) w.wtype = BF16;
  else if (t.scalar_type() == torch::kFloat16) w.wtype = F16;
  else TORCH_CHECK(false, "weights must be float32, bfloat16 or float16");
#ifndef SPECDEC_AVX512
  TORCH_CHECK(!pairs, "weights packed in pairs (bfloat16 products) need an AVX-512 build of the kernels");
#endif
  w.pairs = pairs && w.wtype == BF16;
  w.tensor = pack_blocks(t, w.pairs);
  w.data = static_cast<const char*>(w.tensor.data_ptr());
  return w;
}

// groups of 32 with `bits` 4 or 8 (quantized.h) from a float32, bfloat16 or float16 weight (N, K), K a multiple of 32
Weight make_quantized_weight(const torch::Tensor& t, int bits) {
  TORCH_CHECK(t.dim() == 2 && t.device().is_cpu(), "weights must be 2-D CPU tensors");
  TORCH_CHECK(t.size(1) % kQGroup == 0, "quantized weights need inner sizes that are multiples of 32");
  Weight w;
  w.N = t.size(0);
  w.K = t.size(1);
  w.qbits = bits;
  w.qfmt = bits;  // Q4 or Q8
  w.tensor = pack_quantized(t, bits);  // widened to float32 piece by piece
  w.data = static_cast<const char*>(w.tensor.data_ptr());
  return w;
}

// A weight already packed in `fmt` (pack_codes), of shape (N, K): the bytes are kept, not copied
Weight packed_weight(const torch::Tensor& packed, int fmt, int64_t N, int64_t K) {
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() && packed.dim() == 1,
              "packed weights: contiguous uint8 bytes");
  TORCH_CHECK(K % kQGroup == 0 && (!k_quant(fmt) || K % (kQGroup * kQSuper) == 0), "packed weights: bad inner size");
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  TORCH_CHECK(packed.numel() == blocks * q_block_bytes(fmt, K / kQGroup), "packed weights: wrong size for the shape");
  Weight w;
  w.N = N;
  w.K = K;
  w.qbits = q_bits(fmt);
  w.qfmt = fmt;
  w.tensor = packed;
  w.data = static_cast<const char*>(packed.data_ptr());
  return w;
}

void linear_quantized_any(const Q8Rows& xq, int64_t M, const Weight& w, const float* bias, float* y, int64_t ldy) {
  const uint8_t* packed = reinterpret_cast<const uint8_t*>(w.data);
  with_format(w.qfmt, [&](auto format) {
    linear_quantized<decltype(format)::value>(xq, M, packed, w.N, w.K, bias, y, ldy);
  });
}

// y (M, ldy) columns [0, N) = x (M, K) @ w^T (+ bias), x float32; bf16_products: round x to bfloat16 and
// multiply in pairs (only for weights packed in pairs)
void linear(const float* x, int64_t M, const Weight& w, const float* bias, float* y, int64_t ldy,
            bool bf16_products = false) {
  if (!w.parts.empty()) {
    const bool quantized = std::all_of(w.parts.begin(), w.parts.end(), [](const Weight& p) { return p.qbits; });
    if (quantized) {  // the activations rounded once, and every part's units shared among the threads in one go
      std::vector<QuantizedShare> shares;
      for (size_t i = 0; i < w.parts.size(); ++i) {
        const Weight& p = w.parts[i];
        const int64_t n0 = w.offsets[i];
        shares.push_back(quantized_share(p.qfmt, M, reinterpret_cast<const uint8_t*>(p.data), p.N, p.K,
                                         bias ? bias + n0 : nullptr, y + n0, ldy));
      }
      linear_quantized_parts(quantize_rows(x, M, w.K), shares);
      return;
    }
    for (size_t i = 0; i < w.parts.size(); ++i) {
      const int64_t n0 = w.offsets[i];
      linear(x, M, w.parts[i], bias ? bias + n0 : nullptr, y + n0, ldy, bf16_products && w.parts[i].pairs);
    }
    return;
  }
  if (w.qbits) {
    linear_quantized_any(quantize_rows(x, M, w.K), M, w, bias, y, ldy);
    return;
  }
  TORCH_CHECK(!bf16_products || w.pairs, "bfloat16 products need bfloat16 weights packed in pairs");
#ifdef SPECDEC_AVX512
  if (w.pairs) {
#ifdef SPECDEC_AMX
    if (bf16_products && use_amx(w.K)) {
      linear_amx(x, M, w.data, w.N, w.K, bias, y, ldy);
      return;
    }
#endif
    if (bf16_products) {
      const std::vector<uint16_t> xb = to_bf16(x, M * w.K);  // activations rounded once per product
      linear_blocks<BF16DOT>(xb.data(), M, w.data, w.N, w.K, bias, y, ldy);
    } else {
      linear_blocks<BF16PAIRS>(x, M, w.data, w.N, w.K, bias, y, ldy);
    }
    return;
  }
#endif
  switch (w.wtype) {
    case BF16: linear_blocks<BF16>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
    case F16: linear_blocks<F16>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
    default: linear_blocks<F32>(x, M, w.data, w.N, w.K, bias, y, ldy); break;
  }
}

// y (M, N) float32 = x (M, K) @ w^T (+ bias: float32 (N,) or undefined), as linear() computes it
torch::Tensor product(torch::Tensor x, const Weight& w, const torch::Tensor& bias = torch::Tensor(),
                      bool bf16_products = false) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.K, "x must be (M, in_features)");
  x = x.contiguous().to(torch::kFloat32);
  torch::Tensor y = torch::empty({x.size(0), w.N}, torch::TensorOptions().dtype(torch::kFloat32));
  linear(x.data_ptr<float>(), x.size(0), w, bias.defined() ? bias.data_ptr<float>() : nullptr, y.data_ptr<float>(),
         w.N, bf16_products);
  return y;
}

// A float weight for the kernels: as it is (bits 0; in bfloat16 pairs where bf16_dot), or rounded to groups of 32
// 4- or 8-bit numbers (bits 4 or 8, whose products round the activations to int8 as a drafting copy's do).
Weight float_or_quantized(const torch::Tensor& t, bool bf16_dot, int64_t bits) {
  TORCH_CHECK(bits == 0 || bits == 4 || bits == 8, "bits must be 0 (as given), 4 or 8");
  return bits ? make_quantized_weight(t, static_cast<int>(bits)) : make_weight(t.contiguous(), bf16_dot);
}

// A weight packed once for the kernels (float_or_quantized); y = x @ w^T (+ bias) in float32, with the same
// reduction order as the model's own products (batch-invariant).
class PackedLinear {
 public:
  PackedLinear(torch::Tensor weight, torch::Tensor bias, bool bf16_dot, int64_t bits = 0)
      : weight_(float_or_quantized(weight, bf16_dot, bits)), bf16_dot_(bf16_dot && weight_.pairs) {
    if (bias.defined() && bias.numel()) bias_ = bias.contiguous().to(torch::kFloat32);
  }
  torch::Tensor call(torch::Tensor x) const { return product(x, weight_, bias_, bf16_dot_); }
  int64_t out_features() const { return weight_.N; }
  int64_t in_features() const { return weight_.K; }

 private:
  Weight weight_;
  bool bf16_dot_;
  torch::Tensor bias_;
};
