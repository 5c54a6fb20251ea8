// Where the bytes of quantized weights sit (quantized.h's formats), and the packing that puts them there. Part of
// cpu_llama.cpp's translation unit, included after products.h and before quantized.h.
//
// A block of 64 output rows is read in groups of 32 k (one d, and m for 4 bits, per row and group), each group in 8
// quads of 4 k. A quad of a block is 64 bytes for every 16 rows at 8 bits (byte 4i + j: q of row i, k = 4quad + j)
// and for every 32 rows at 4 bits (byte 4i + j: u of row i in its low nibble, of row 16 + i in its high one): its
// units, 4 or 2. K5's 5-bit and K6's 6-bit codes keep their low 4 bits so, and a unit's quad then has their high
// bits. K5's: 16 more bytes, the code at position p = 64 * (row / 16) + 4 * (row % 16) + j of the unit has its fifth
// bit in byte p % 16, bit p / 16, so that one 16-byte load, broadcast, gives each run of 16 positions its bit plane
// (qv::fifth_bits). K6's: 32 more bytes, the code at position p has its two high bits in byte p % 32, bits
// 2 (p / 32) and 2 (p / 32) + 1, so that a shift and a mask of one 32-byte load give a half-vector its bits
// (qv::crumbs). A weight then takes the file's bits: 4.5 a weight for Q4_0, 5 for Q4_1, 6.56 for Q6_K.
//
// The units are split among kStreams streams, each stream a contiguous run of its units' bytes group after group
// (quads, then its rows' d, then their m). AVX2 builds give every unit a stream of its own: a one-row product then
// reads 4 (or 2) sequential streams at once, as the 16-bit products do (products.h's packed_at), and Zen 3 reads
// them much faster than one: a one-row 8-bit product over Qwen3-0.6B's LM head (165 MB) took 9.35 ms on one core
// from one stream, 6.25 ms from four (experiments/head_products.py). AVX-512 builds keep one stream a block.
#pragma once

constexpr int kQGroup = 32;  // weights sharing one d (and m)
constexpr int kQSuper = 8;  // groups of a K-quant super-block (256 weights), which share its float16 d (and dmin)

// The formats of quantized blocks. The value of the two original ones is their bit count, so that QLayout<8> and
// linear_quantized<4> keep meaning what they always did.
//  Q4: w = d * u + m, u in 0..15, d and m float16 per group (llama.cpp's Q4_1, and the drafting copy).
//  Q40: w = d * u + m with m = -8 d, u in 0..15, d float16 per group (Q4_0: m is not stored, but computed in
//       float32, exactly).
//  Q8: w = d * q, q in -128..127, d float16 per group (Q8_0, the screen of an LM head).
//  K4: w = (d * sc) * u + (-dmin) * mn, u in 0..15, sc and mn in 0..63 per group, d and -dmin float16 per
//      super-block (Q4_K; d * sc and dmin * mn are exact in float32).
//  K5: as K4 with u in 0..31, its fifth bit stored apart (Q5_K).
//  K6: w = (d * sc) * q, q = u - 32, u in 0..63 (its fifth and sixth bits stored apart), sc int8 per 16 weights, d
//      float16 per super-block (Q6_K).
enum QFormat : int { Q4 = 4, Q40 = 41, Q8 = 8, K4 = 40, K5 = 50, K6 = 60 };

// the bits of a code as the layout holds it: 8 (one byte a code, Q8) or 4 (nibbles, and K5's and K6's high bits
// apart)
constexpr int q_bits(int fmt) { return fmt == Q8 ? 8 : 4; }
// codes held as signed numbers in the products (|w| times x with w's sign): Q8's. K6's q = u - 32 are multiplied as
// u, unsigned, with an offset (quantized_steps.h's k6_half_offset)
constexpr bool signed_codes(int fmt) { return fmt == Q8; }
// bytes of a unit's quad past its codes' low nibbles: K5's fifth bits, K6's fifth and sixth
constexpr int high_bytes(int fmt) { return fmt == K5 ? 16 : fmt == K6 ? 32 : 0; }
constexpr bool k_quant(int fmt) { return fmt == K4 || fmt == K5 || fmt == K6; }
// formats with a minimum per group (w = d * u + m): the products add m times the activations' sum
constexpr bool has_min(int fmt) { return fmt == Q4 || fmt == Q40 || fmt == K4 || fmt == K5; }
// K4 and K5: d and m of a group are the super-block's d and -dmin times the group's 6-bit sc and mn
constexpr bool k_min(int fmt) { return fmt == K4 || fmt == K5; }

// f(std::integral_constant<int, FMT>{}) for the format fmt names (K6 for any other: the packed weights' formats are
// checked where they are packed, pack_codes): the one switch from a format number to the templates of that format
template <typename F>
inline decltype(auto) with_format(int fmt, F&& f) {
  switch (fmt) {
    case Q4: return f(std::integral_constant<int, Q4>{});
    case Q40: return f(std::integral_constant<int, Q40>{});
    case Q8: return f(std::integral_constant<int, Q8>{});
    case K4: return f(std::integral_constant<int, K4>{});
    case K5: return f(std::integral_constant<int, K5>{});
    default: return f(std::integral_constant<int, K6>{});
  }
}

template <int FMT>
struct QLayout {
  static constexpr int kBits = q_bits(FMT);
  static constexpr int kUnits = kBits == 8 ? 4 : 2;  // 64-byte pieces of a quad
#ifdef SPECDEC_AVX512
  static constexpr int kStreams = 1;
#else
  static constexpr int kStreams = kUnits;
#endif
  static constexpr int kUnitsPerStream = kUnits / kStreams;
  static constexpr int kRowsPerStream = kBlockCols / kStreams;
  static constexpr int64_t kQuadBytes = 64 + high_bytes(FMT);  // a unit's quad: codes (and high bits)
  static constexpr int64_t kQuadStep = kQuadBytes * kUnitsPerStream;  // from a unit's quad to its next
  static constexpr int64_t kQuadsBytes = (kQGroup / 4) * kQuadStep;  // a stream's quads of one group
  // its rows' per-group numbers: d (float16), and m for Q4; sc and mn (uint8) for K4; two sc (int8) for K6
  static constexpr int64_t kScaleBytes = k_quant(FMT) ? kRowsPerStream : kRowsPerStream * 2;
  static constexpr int kScales = FMT == Q8 || FMT == Q40 ? 1 : 2;
  static constexpr int64_t kChunkBytes = kQuadsBytes + kScales * kScaleBytes;  // a stream's group
  // a K-quant block ends with its super-blocks' float16 numbers, 64 rows each: d (and -dmin for K4)
  static constexpr int64_t kSuperBytes = k_min(FMT) ? 4 * kBlockCols : FMT == K6 ? 2 * kBlockCols : 0;

  static int64_t block_bytes(int64_t G) {
    return kStreams * G * kChunkBytes + (k_quant(FMT) ? G / kQSuper * kSuperBytes : 0);
  }
  // byte offsets within a block of G groups: stream s's group g; quad `quad` of unit u; d (and m) of 16 rows at v
  static int64_t chunk(int s, int64_t g, int64_t G) { return (s * G + g) * kChunkBytes; }
  static int64_t unit(int64_t g, int quad, int u, int64_t G) {
    return chunk(u / kUnitsPerStream, g, G) + quad * kQuadStep + kQuadBytes * (u % kUnitsPerStream);
  }
  // the first of the group's numbers (d, or sc) of 16 rows at v, and its second (m, mn, or the second sc)
  static int64_t d(int64_t g, int v, int64_t G) {
    const int row = 16 * v;
    return chunk(row / kRowsPerStream, g, G) + kQuadsBytes + (kScaleBytes / kRowsPerStream) * (row % kRowsPerStream);
  }
  static int64_t m(int64_t g, int v, int64_t G) { return d(g, v, G) + kScaleBytes; }
  // a K-quant super-block's float16 d of 16 rows at v, and its -dmin (K4)
  static int64_t super_d(int64_t g, int v, int64_t G) {
    return kStreams * G * kChunkBytes + (g / kQSuper) * kSuperBytes + 32 * v;
  }
  static int64_t super_m(int64_t g, int v, int64_t G) { return super_d(g, v, G) + 2 * kBlockCols; }
};

// Bytes of one group of a block (all its streams), for the Q4 and Q8 formats
constexpr int64_t q_group_bytes(int bits) {
  return kBlockCols * kQGroup * bits / 8 + (bits == 4 ? 2 : 1) * kBlockCols * 2;
}
static_assert(QLayout<Q8>::kStreams * QLayout<Q8>::kChunkBytes == q_group_bytes(8), "8-bit layout");
static_assert(QLayout<Q4>::kStreams * QLayout<Q4>::kChunkBytes == q_group_bytes(4), "4-bit layout");

inline int64_t q_block_bytes(int fmt, int64_t G) {
  return with_format(fmt, [&](auto format) { return QLayout<decltype(format)::value>::block_bytes(G); });
}

// A quantized weight as numbers, row by row, before packing: codes (N, K) uint8 (u, for Q4, Q40, K4 and K5) or int8
// (q, for Q8 and K6); first, second (N, G): the groups' d and m (float16) for Q4, d (float16) for Q40 and Q8, sc and
// mn (uint8) for K4 and K5, the two halves' sc (int8) for K6; super_d, super_m (N, G / 8) float16: a K-quant's d,
// and -dmin for K4 and K5.
struct QCodes {
  int fmt;
  torch::Tensor codes, first, second, super_d, super_m;
};

// rows [n0, n0 + count) of every tensor of `c` (whole blocks of 64 rows, so that packed pieces concatenate)
inline QCodes rows_of(const QCodes& c, int64_t n0, int64_t count) {
  auto part = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, n0, count) : t; };
  return {c.fmt, part(c.codes), part(c.first), part(c.second), part(c.super_d), part(c.super_m)};
}

// QCodes -> blocks of 64 output rows in QLayout<FMT>'s order; rows past N are zero
template <int FMT>
torch::Tensor pack_codes_as(const QCodes& c) {
  using L = QLayout<FMT>;
  const int64_t N = c.codes.size(0), K = c.codes.size(1), G = K / kQGroup;
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols, S = L::kStreams, U = L::kUnitsPerStream;
  auto padded = [&](const torch::Tensor& t) {  // (N, ...) -> (blocks * 64, ...), zeros past N
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    shape[0] = blocks * kBlockCols;
    torch::Tensor out = torch::zeros(shape, t.options());
    out.narrow(0, 0, N).copy_(t);
    return out;
  };
  // (blocks * 64, G) numbers -> bytes (blocks, S, G, numbers' bytes of 64 / S rows)
  auto per_group = [&](const torch::Tensor& t) {
    return padded(t).contiguous().view({blocks, S, kBlockCols / S, G}).permute({0, 1, 3, 2}).contiguous()
        .view(torch::kUInt8).view({blocks, S, G, -1});
  };
  torch::Tensor codes = padded(c.codes).view(torch::kUInt8);
  if constexpr (FMT == K6) codes = codes.add(32);  // q in -32..31 -> u = q + 32 in 0..63 (uint8 wraps)
  std::vector<torch::Tensor> pieces;
  if constexpr (L::kBits == 8) {
    // (blocks, S, units, 16 i, G, 8 quad, 4 j) -> (blocks, S, G, quad, units, i, j)
    pieces.push_back(codes.view({blocks, S, U, 16, G, 8, 4}).permute({0, 1, 4, 5, 2, 3, 6}).contiguous()
                         .view({blocks, S, G, -1}));
  } else {
    // (blocks, S, units, 2 half, 16 i, G, 8 quad, 4 j) -> (blocks, S, G, quad, units, half, i, j)
    const torch::Tensor q = codes.view({blocks, S, U, 2, 16, G, 8, 4}).permute({0, 1, 5, 6, 2, 3, 4, 7});
    const torch::Tensor low = q.bitwise_and(15);
    std::vector<torch::Tensor> quad{low.select(5, 0).bitwise_or(low.select(5, 1).bitwise_left_shift(4)).contiguous()
                                        .view({blocks, S, G, 8, U, 64})};
    const auto bytes = torch::TensorOptions().dtype(torch::kUInt8);
    if constexpr (FMT == K5) {
      // the fifth bits of a unit's quad: position p = 64 half + 4 i + j -> byte p % 16, bit p / 16
      const torch::Tensor bit = q.bitwise_right_shift(4).contiguous().view({blocks, S, G, 8, U, 8, 16});
      const torch::Tensor weights = torch::tensor({1, 2, 4, 8, 16, 32, 64, 128}, bytes).view({8, 1});
      quad.push_back(bit.mul(weights).sum(5, false, torch::kUInt8));  // (blocks, S, G, 8, U, 16)
    } else if constexpr (FMT == K6) {
      // the two high bits of a unit's quad: position p -> byte p % 32, bits 2 (p / 32) and 2 (p / 32) + 1
      const torch::Tensor pair = q.bitwise_right_shift(4).contiguous().view({blocks, S, G, 8, U, 4, 32});
      const torch::Tensor weights = torch::tensor({1, 4, 16, 64}, bytes).view({4, 1});
      quad.push_back(pair.mul(weights).sum(5, false, torch::kUInt8));  // (blocks, S, G, 8, U, 32)
    }
    pieces.push_back(torch::cat(quad, -1).contiguous().view({blocks, S, G, -1}));
  }
  pieces.push_back(per_group(c.first));
  if (L::kScales == 2) pieces.push_back(per_group(c.second));
  torch::Tensor groups = torch::cat(pieces, -1).contiguous().view({blocks, -1});
  if constexpr (k_quant(FMT)) {
    // (blocks * 64, G / 8) -> (blocks, G / 8, numbers, 64 rows)
    std::vector<torch::Tensor> supers{padded(c.super_d).view({blocks, kBlockCols, G / kQSuper}).permute({0, 2, 1})};
    if (k_min(FMT)) supers.push_back(padded(c.super_m).view({blocks, kBlockCols, G / kQSuper}).permute({0, 2, 1}));
    const torch::Tensor tail = torch::stack(supers, 2).contiguous().view(torch::kUInt8).view({blocks, -1});
    groups = torch::cat({groups, tail}, -1);
  }
  return groups.contiguous().view({-1});
}

// QCodes -> packed bytes, 4,096 rows (whole blocks) at a time so that the temporaries stay small
torch::Tensor pack_codes(const QCodes& c) {
  const int64_t N = c.codes.size(0), K = c.codes.size(1);
  TORCH_CHECK(c.codes.dim() == 2 && K % kQGroup == 0, "quantized codes: (N, K), K a multiple of 32");
  TORCH_CHECK(!k_quant(c.fmt) || K % (kQGroup * kQSuper) == 0, "K-quants: K a multiple of 256");
  constexpr int64_t kRowsAtOnce = 64 * kBlockCols;
  if (N > kRowsAtOnce) {
    std::vector<torch::Tensor> parts;
    for (int64_t n0 = 0; n0 < N; n0 += kRowsAtOnce)
      parts.push_back(pack_codes(rows_of(c, n0, std::min(kRowsAtOnce, N - n0))));
    return torch::cat(parts);
  }
  switch (c.fmt) {
    case Q4: return pack_codes_as<Q4>(c);
    case Q40: return pack_codes_as<Q40>(c);
    case Q8: return pack_codes_as<Q8>(c);
    case K4: return pack_codes_as<K4>(c);
    case K5: return pack_codes_as<K5>(c);
    case K6: return pack_codes_as<K6>(c);
    default: TORCH_CHECK(false, "unknown quantized format ", c.fmt);
  }
}

// (N, K) float -> blocks of 64 output rows in QLayout<bits>'s order. 8 bits: w = d * q, d = max|w| / 127 of the
// group. 4 bits: w = d * u + m, m the group's minimum, d its range / 15. Large weights are quantized 4,096 rows at
// a time, so that the float32 temporaries stay small.
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
  const torch::Tensor g = weight.to(torch::kFloat32).reshape({N, G, kQGroup});
  auto half = [](const torch::Tensor& t) { return t.squeeze(-1).to(torch::kFloat16); };
  if (bits == 8) {
    const torch::Tensor d = (g.abs().amax(-1, true) / 127.0).to(torch::kFloat16).to(torch::kFloat32);
    const torch::Tensor q = torch::where(d > 0, (g / d.clamp_min(1e-30)).round().clamp(-127, 127),
                                         torch::zeros_like(g));
    return pack_codes({Q8, q.to(torch::kInt8).view({N, K}), half(d), {}, {}, {}});
  }
  const torch::Tensor lo = std::get<0>(g.min(-1, true)), hi = std::get<0>(g.max(-1, true));
  const torch::Tensor m = lo.to(torch::kFloat16).to(torch::kFloat32);
  const torch::Tensor d = ((hi - lo) / 15.0).to(torch::kFloat16).to(torch::kFloat32);
  const torch::Tensor u = torch::where(d > 0, ((g - m) / d.clamp_min(1e-30)).round().clamp(0, 15),
                                       torch::zeros_like(g));
  return pack_codes({Q4, u.to(torch::kUInt8).view({N, K}), half(d), half(m), {}, {}});
}

// The 8-bit weights of `blocks` packed blocks starting at `packed` (the bytes of pack_quantized(., 8)) as numbers:
// q (blocks * 64, G, 32) int8 and d (blocks * 64, G) float16, row by row (rows past N included).
std::pair<torch::Tensor, torch::Tensor> unpack_q8(const torch::Tensor& packed, int64_t blocks, int64_t G) {
  using L = QLayout<Q8>;
  const torch::Tensor chunks = packed.view({blocks, L::kStreams, G, L::kChunkBytes});
  // (blocks, S, G, 8 quad, units, 16 i, 4 j) -> (blocks, S, units, i, G, quad, j): row 16 unit + i, k = 4 quad + j
  const torch::Tensor q = chunks.narrow(3, 0, L::kQuadsBytes).contiguous().view(torch::kInt8)
                              .view({blocks, L::kStreams, G, 8, L::kUnitsPerStream, 16, 4})
                              .permute({0, 1, 4, 5, 2, 3, 6}).reshape({blocks * kBlockCols, G, kQGroup});
  const torch::Tensor d = chunks.narrow(3, L::kQuadsBytes, L::kScaleBytes).contiguous().view(torch::kFloat16)
                              .permute({0, 1, 3, 2}).reshape({blocks * kBlockCols, G});
  return {q, d};
}

// Row n of a weight packed in QLayout<FMT> (N, K) as float32 numbers, out (K,): the values the file's format
// defines, in its float32 steps (d * u + m for Q4, (d * sc) * u + (-dmin * mn) for K4, each product exact), as the
// gguf package dequantizes them. For embedding lookups in a quantized table, and for tests of the packing.
template <int FMT>
void dequantized_row_as(const uint8_t* packed, int64_t n, int64_t K, float* out) {
  using L = QLayout<FMT>;
  const int64_t G = K / kQGroup;
  const uint8_t* block = packed + (n / kBlockCols) * L::block_bytes(G);
  const int i = static_cast<int>(n % kBlockCols), v = i / 16, lane = i % 16;
  auto half_at = [&](int64_t at) {
    uint16_t h;
    std::memcpy(&h, block + at + 2 * lane, sizeof(h));
    return _cvtsh_ss(h);
  };
  for (int64_t g = 0; g < G; ++g)
    for (int k = 0; k < kQGroup; ++k) {
      const int quad = k / 4, j = k % 4;
      float w;
      if constexpr (L::kBits == 8) {
        const int8_t q = static_cast<int8_t>(block[L::unit(g, quad, v, G) + 4 * lane + j]);
        w = half_at(L::d(g, v, G)) * static_cast<float>(q);
      } else {
        const int64_t unit = L::unit(g, quad, v / 2, G);
        const uint8_t byte = block[unit + 4 * lane + j];
        int u = (v % 2) ? byte >> 4 : byte & 0x0F;
        const int p = 64 * (v % 2) + 4 * lane + j;
        if constexpr (FMT == K5) u += ((block[unit + 64 + p % 16] >> (p / 16)) & 1) << 4;
        if constexpr (FMT == K6) u += ((block[unit + 64 + p % 32] >> (2 * (p / 32))) & 3) << 4;
        if constexpr (FMT == K6) {
          const int8_t sc = static_cast<int8_t>(block[(k < 16 ? L::d(g, v, G) : L::m(g, v, G)) + lane]);
          w = half_at(L::super_d(g, v, G)) * static_cast<float>(sc) * static_cast<float>(u - 32);
        } else if constexpr (k_min(FMT)) {
          const float d = half_at(L::super_d(g, v, G)) * static_cast<float>(block[L::d(g, v, G) + lane]);
          const float m = half_at(L::super_m(g, v, G)) * static_cast<float>(block[L::m(g, v, G) + lane]);
          w = d * static_cast<float>(u) + m;
        } else {
          const float d = half_at(L::d(g, v, G));
          w = d * static_cast<float>(u) + (FMT == Q40 ? d * -8.0f : half_at(L::m(g, v, G)));
        }
      }
      out[g * kQGroup + k] = w;
    }
}

void dequantized_row(int fmt, const uint8_t* packed, int64_t n, int64_t K, float* out) {
  with_format(fmt, [&](auto format) { dequantized_row_as<decltype(format)::value>(packed, n, K, out); });
}
