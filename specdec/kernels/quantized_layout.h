// Where the bytes of quantized weights sit (quantized.h's formats), and the packing that puts them there. Part of
// cpu_llama.cpp's translation unit, included after products.h and before quantized.h.
//
// A block of 64 output rows is read in groups of 32 k (one d, and m for 4 bits, per row and group), each group in 8
// quads of 4 k. A quad of a block is 64 bytes for every 16 rows at 8 bits (byte 4i + j: q of row i, k = 4quad + j)
// and for every 32 rows at 4 bits (byte 4i + j: u of row i in its low nibble, of row 16 + i in its high one): its
// units, 4 or 2. The units are split among kStreams streams, each stream a contiguous run of its units' bytes group
// after group (quads, then its rows' d, then their m). AVX2 builds give every unit a stream of its own: a one-row
// product then reads 4 (or 2) sequential streams at once, as the 16-bit products do (products.h's packed_at), and
// Zen 3 reads them much faster than one: a one-row 8-bit product over Qwen3-0.6B's LM head (165 MB) took 9.35 ms on
// one core from one stream, 6.25 ms from four (experiments/head_products.py). AVX-512 builds keep one stream a block.
#pragma once

constexpr int kQGroup = 32;  // weights sharing one d (and m)

template <int BITS>
struct QLayout {
  static constexpr int kUnits = BITS == 8 ? 4 : 2;  // 64-byte pieces of a quad
#ifdef SPECDEC_AVX512
  static constexpr int kStreams = 1;
#else
  static constexpr int kStreams = kUnits;
#endif
  static constexpr int kUnitsPerStream = kUnits / kStreams;
  static constexpr int kRowsPerStream = kBlockCols / kStreams;
  static constexpr int64_t kQuadsBytes = (kQGroup / 4) * 64 * kUnitsPerStream;  // a stream's quads of one group
  static constexpr int64_t kScaleBytes = kRowsPerStream * 2;  // its rows' d (float16), and as many for m
  static constexpr int64_t kChunkBytes = kQuadsBytes + (BITS == 4 ? 2 : 1) * kScaleBytes;  // a stream's group

  // byte offsets within a block of G groups: stream s's group g; quad `quad` of unit u; d (and m) of 16 rows at v
  static int64_t chunk(int s, int64_t g, int64_t G) { return (s * G + g) * kChunkBytes; }
  static int64_t unit(int64_t g, int quad, int u, int64_t G) {
    return chunk(u / kUnitsPerStream, g, G) + quad * 64 * kUnitsPerStream + 64 * (u % kUnitsPerStream);
  }
  static int64_t d(int64_t g, int v, int64_t G) {
    const int row = 16 * v;
    return chunk(row / kRowsPerStream, g, G) + kQuadsBytes + 2 * (row % kRowsPerStream);
  }
  static int64_t m(int64_t g, int v, int64_t G) { return d(g, v, G) + kScaleBytes; }
};

// Bytes of one group of a block (all its streams)
constexpr int64_t q_group_bytes(int bits) {
  return kBlockCols * kQGroup * bits / 8 + (bits == 4 ? 2 : 1) * kBlockCols * 2;
}
static_assert(QLayout<8>::kStreams * QLayout<8>::kChunkBytes == q_group_bytes(8), "8-bit layout");
static_assert(QLayout<4>::kStreams * QLayout<4>::kChunkBytes == q_group_bytes(4), "4-bit layout");

// (N, K) float -> blocks of 64 output rows in QLayout<bits>'s order; rows past N are zero. 8 bits: w = d * q,
// d = max|w| / 127 of the group. 4 bits: w = d * u + m, m the group's minimum, d its range / 15. Large weights are
// packed 4,096 rows at a time (whole blocks), so that the float32 temporaries stay small.
torch::Tensor pack_quantized(const torch::Tensor& weight, int bits) {
  constexpr int64_t kRowsAtOnce = 64 * kBlockCols;
  if (weight.size(0) > kRowsAtOnce) {
    std::vector<torch::Tensor> parts;
    for (int64_t n0 = 0; n0 < weight.size(0); n0 += kRowsAtOnce)
      parts.push_back(pack_quantized(weight.narrow(0, n0, std::min(kRowsAtOnce, weight.size(0) - n0)), bits));
    return torch::cat(parts);
  }
  TORCH_CHECK(bits == 4 || bits == 8, "quantized weights have 4 or 8 bits");
  const int64_t N = weight.size(0), K = weight.size(1), G = K / kQGroup;
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  torch::Tensor w = torch::zeros({blocks * kBlockCols, K}, torch::kFloat32);
  w.narrow(0, 0, N).copy_(weight);
  const torch::Tensor g = w.view({blocks, kBlockCols, G, kQGroup});
  const int S = bits == 8 ? QLayout<8>::kStreams : QLayout<4>::kStreams;
  const int64_t units_per_stream = bits == 8 ? QLayout<8>::kUnitsPerStream : QLayout<4>::kUnitsPerStream;
  auto scales = [&](const torch::Tensor& s) {  // (blocks, 64, G, 1) -> float16 bytes (blocks, S, G, 2 * 64 / S)
    return s.squeeze(-1).to(torch::kFloat16).view({blocks, S, kBlockCols / S, G}).permute({0, 1, 3, 2})
        .contiguous().view(torch::kUInt8);
  };
  std::vector<torch::Tensor> pieces;
  if (bits == 8) {
    const torch::Tensor d = (g.abs().amax(-1, true) / 127.0).to(torch::kFloat16).to(torch::kFloat32);
    const torch::Tensor q = torch::where(d > 0, (g / d.clamp_min(1e-30)).round().clamp(-127, 127),
                                         torch::zeros_like(g));
    // (blocks, S, units, 16 i, G, 8 quad, 4 j) -> (blocks, S, G, quad, units, i, j)
    pieces = {q.to(torch::kInt8).view({blocks, S, units_per_stream, 16, G, 8, 4}).permute({0, 1, 4, 5, 2, 3, 6})
                  .contiguous().view(torch::kUInt8).view({blocks, S, G, -1}),
              scales(d)};
  } else {
    const torch::Tensor lo = std::get<0>(g.min(-1, true)), hi = std::get<0>(g.max(-1, true));
    const torch::Tensor m = lo.to(torch::kFloat16).to(torch::kFloat32);
    const torch::Tensor d = ((hi - lo) / 15.0).to(torch::kFloat16).to(torch::kFloat32);
    const torch::Tensor u = torch::where(d > 0, ((g - m) / d.clamp_min(1e-30)).round().clamp(0, 15),
                                         torch::zeros_like(g));
    // (blocks, S, units, 2 half, 16 i, G, 8 quad, 4 j) -> (blocks, S, G, quad, units, half, i, j)
    const torch::Tensor q = u.to(torch::kUInt8).view({blocks, S, units_per_stream, 2, 16, G, 8, 4})
                                .permute({0, 1, 5, 6, 2, 3, 4, 7});
    pieces = {q.select(5, 0).bitwise_or(q.select(5, 1).bitwise_left_shift(4)).contiguous()
                  .view({blocks, S, G, -1}),
              scales(d), scales(m)};
  }
  return torch::cat(pieces, -1).contiguous().view({-1});
}

// The 8-bit weights of `blocks` packed blocks starting at `packed` (the bytes of pack_quantized(., 8)) as numbers:
// q (blocks * 64, G, 32) int8 and d (blocks * 64, G) float16, row by row (rows past N included).
std::pair<torch::Tensor, torch::Tensor> unpack_q8(const torch::Tensor& packed, int64_t blocks, int64_t G) {
  using L = QLayout<8>;
  const torch::Tensor chunks = packed.view({blocks, L::kStreams, G, L::kChunkBytes});
  // (blocks, S, G, 8 quad, units, 16 i, 4 j) -> (blocks, S, units, i, G, quad, j): row 16 unit + i, k = 4 quad + j
  const torch::Tensor q = chunks.narrow(3, 0, L::kQuadsBytes).contiguous().view(torch::kInt8)
                              .view({blocks, L::kStreams, G, 8, L::kUnitsPerStream, 16, 4})
                              .permute({0, 1, 4, 5, 2, 3, 6}).reshape({blocks * kBlockCols, G, kQGroup});
  const torch::Tensor d = chunks.narrow(3, L::kQuadsBytes, L::kScaleBytes).contiguous().view(torch::kFloat16)
                              .permute({0, 1, 3, 2}).reshape({blocks * kBlockCols, G});
  return {q, d};
}
