// The tile for four rows of activations on AVX2 (verification, batches, prefill): one vector of 16 columns at a
// time, the rows' sums in registers. Part of cpu_llama.cpp's translation unit, included after quantized_steps.h and
// before quantized.h, whose tile_quantized hands groups of four rows to it on AVX2 builds.
#pragma once
// Up to 4 rows' integer sums of one vector, as named members, each row's step written out (row_quad) instead of a
// loop over an array. qv::pin keeps the chains of adds from becoming trees; with it, the same tile over an array of
// sums (pinned too) ran smollm2's 16- and 200-token passes about 7% slower (more stack traffic around the groups).
struct RowSums {
  qv::i32x16 r0, r1, r2, r3;
};

template <int J>
inline __attribute__((always_inline)) qv::i32x16& row_of(RowSums& s) {
  if constexpr (J == 0) return s.r0;
  else if constexpr (J == 1) return s.r1;
  else if constexpr (J == 2) return s.r2;
  else return s.r3;
}

// Row J's step at a quad (MR rows, J < MR): K5's middle, then the quad's products added to its sums (K6's codes
// unsigned: see vector_by_rows)
template <int MR, int FMT, int J>
inline __attribute__((always_inline)) void row_quad(int quad, RowSums& sums, RowSums& halves, qv::i32x16 w,
                                                    const int8_t* xj) {
  if constexpr (J < MR) {
    k5_middle<FMT>(quad, row_of<J>(sums), row_of<J>(halves));
    row_of<J>(sums) = add_quad<FMT>(row_of<J>(sums), w, qv::broadcast4(xj + quad * 4));
    qv::pin(row_of<J>(sums));
  }
}

// K6's half-group of row J ends: 32 times its activations' sums taken off its 16-bit sums of u times x (x_half: the
// half's 16 activations), which become those of q = u - 32 times x
template <int MR, int FMT, int J>
inline __attribute__((always_inline)) void offset_row_half(RowSums& sums, const int8_t* x_half) {
  if constexpr (J < MR && FMT == K6) row_of<J>(sums) = less_offset<FMT>(row_of<J>(sums), k6_half_offset<FMT>(x_half));
}

template <int MR, int FMT, int J>
inline __attribute__((always_inline)) void close_row_half(RowSums& sums, RowSums& halves, qv::i32x16 sc,
                                                          const int8_t* xj) {
  if constexpr (J < MR) {
    offset_row_half<MR, FMT, J>(sums, xj);
    row_of<J>(halves) = close_first_half<FMT>(row_of<J>(sums), sc);
  }
}

// This tile reads a 4-bit stream twice, once a nibble (vector_by_rows), the second time from cache: memory would
// idle through that pass, and a 4-row product from memory cost the sum of its reads and its arithmetic (Q4_1
// 1,536 x 576: 0.080 ms against 0.040 in cache and 0.041 for one row from memory, Zen 3). So each pass fetches half
// of the next stream's group into L2 (its first half while the low nibbles are read, its second with the high ones):
// the next stream's reads overlap both passes' arithmetic, 5-16% faster at four rows. 8-bit streams are read once;
// a second stream fetched beside each made the LM head's 2- and 4-row products slower
// (docs/experiments/gguf-kernels.md).
template <int FMT, bool HIGH>
inline __attribute__((always_inline)) void prefetch_half_chunk(const uint8_t* chunk) {
  constexpr int64_t lines = (QLayout<FMT>::kChunkBytes + 63) / 64, half = (lines + 1) / 2;
#pragma GCC unroll 8
  for (int64_t line = HIGH ? half : 0; line < (HIGH ? lines : half); ++line)
    _mm_prefetch(reinterpret_cast<const char*>(chunk + 64 * line), _MM_HINT_T1);
}

// Where the stream after the one vector v reads begins: the block's next stream, or the next block's first (blocks
// are contiguous); nullptr where nothing is fetched ahead (8-bit streams)
template <int FMT>
inline const uint8_t* next_stream(const uint8_t* block, int v, int64_t G) {
  using L = QLayout<FMT>;
  if constexpr (L::kBits != 4) return nullptr;
  const int stream = v / 2 / L::kUnitsPerStream;
  return stream + 1 < L::kStreams ? block + L::chunk(stream + 1, 0, G) : block + L::block_bytes(G);
}

// One vector of 16 columns (v) for MR <= 4 rows on AVX2 (16 registers): the rows' integer sums (two registers each),
// the quad's weights (two) and one broadcast of activations stay in registers. Each row reads its activations
// through a pointer of its own, so every broadcast is one load at a constant offset; 4-bit weights take their low
// or high nibbles (HIGH: v is odd), known before the loop. K6's codes stay unsigned (u = q + 32), as in every
// tile, and each half-group's 16-bit sums lose 32 times the activations' sums as it ends (offset_row_half): two
// operations a row and half-group instead of applying q's sign to x at every quad. The 16-bit sums of u times x
// may wrap, but those of q times x do not (|q| <= 32: below 2^15, see sums16), and wrapping is exact modulo 2^16:
// the same integers. The integer sums are exact in any order, and each group ends with group_step as in
// tile_quantized: the same outputs.
template <int MR, int FMT, bool HIGH>
inline __attribute__((always_inline)) void vector_by_rows(const Q8Rows& x, int64_t row0, int64_t K,
                                                          const uint8_t* __restrict block, int v,
                                                          const uint8_t* next_stream, f32x16 (&acc)[MR]) {
  static_assert(MR <= 4, "RowSums holds 4 rows");
  using L = QLayout<FMT>;
  const int64_t G = K / kQGroup;
  f32x16 super_d[kVecs], super_m[kVecs];
  const int8_t* x0 = x.q.data() + row0 * K;
  const int8_t* x1 = x0 + (MR > 1 ? K : 0);
  const int8_t* x2 = x0 + (MR > 2 ? 2 * K : 0);
  const int8_t* x3 = x0 + (MR > 3 ? 3 * K : 0);
  for (int64_t g = 0; g < G; ++g, x0 += kQGroup, x1 += kQGroup, x2 += kQGroup, x3 += kQGroup) {
    load_super<FMT>(block, g, G, super_d, super_m);
    if (next_stream) prefetch_half_chunk<FMT, HIGH>(next_stream + g * L::kChunkBytes);
    const uint8_t* unit = block + L::unit(g, 0, L::kBits == 4 ? v / 2 : v, G);
    RowSums sums{qv::zero(), qv::zero(), qv::zero(), qv::zero()}, halves = sums;
#pragma GCC unroll 8
    for (int quad = 0; quad < kQGroup / 4; ++quad) {
      if constexpr (FMT == K6) {
        if (quad == kQGroup / 8) {
          const qv::i32x16 sc = qv::widen_s8(block + L::d(g, v, G));
          close_row_half<MR, FMT, 0>(sums, halves, sc, x0), close_row_half<MR, FMT, 1>(sums, halves, sc, x1);
          close_row_half<MR, FMT, 2>(sums, halves, sc, x2), close_row_half<MR, FMT, 3>(sums, halves, sc, x3);
        }
      }
      const uint8_t* at = unit + quad * L::kQuadStep;
      qv::i32x16 w = qv::load(at);
      if constexpr (L::kBits == 4) w = vector_codes<FMT, HIGH>(at, w);
      row_quad<MR, FMT, 0>(quad, sums, halves, w, x0), row_quad<MR, FMT, 1>(quad, sums, halves, w, x1);
      row_quad<MR, FMT, 2>(quad, sums, halves, w, x2), row_quad<MR, FMT, 3>(quad, sums, halves, w, x3);
    }
    offset_row_half<MR, FMT, 0>(sums, x0 + 16), offset_row_half<MR, FMT, 1>(sums, x1 + 16);
    offset_row_half<MR, FMT, 2>(sums, x2 + 16), offset_row_half<MR, FMT, 3>(sums, x3 + 16);
    qv::i32x16 isum[MR], half_sum[MR];
    const qv::i32x16 all[4] = {sums.r0, sums.r1, sums.r2, sums.r3}, all_halves[4] = {halves.r0, halves.r1,
                                                                                     halves.r2, halves.r3};
    for (int j = 0; j < MR; ++j) isum[j] = widened<FMT>(all[j]), half_sum[j] = all_halves[j];
    group_step<MR, FMT>(x, row0, g, G, block, v, super_d[v], super_m[v], isum, half_sum, acc);
  }
}

// The tile for several rows on AVX2: the block's vectors [v0, v0 + NV) one at a time (vector_by_rows), the weights'
// nibble half chosen outside the loops over k.
template <int MR, int FMT, int NV>
__attribute__((noinline)) void tile_quantized_by_vector(const Q8Rows& x, int64_t row0, int64_t K,
                                                        const uint8_t* __restrict block, int v0, int valid,
                                                        const float* __restrict bias, float* __restrict y,
                                                        int64_t ldy) {
  f32x16 acc[MR][NV];
  for (int j = 0; j < MR; ++j)
    for (int v = 0; v < NV; ++v) acc[j][v] = vec::zero();
  for (int v = 0; v < NV && live_lanes(valid, v0 + v); ++v) {
    f32x16 out[MR];
    for (int j = 0; j < MR; ++j) out[j] = vec::zero();
    if constexpr (q_bits(FMT) == 4) {
      const uint8_t* next = next_stream<FMT>(block, v0 + v, K / kQGroup);
      if ((v0 + v) % 2) vector_by_rows<MR, FMT, true>(x, row0, K, block, v0 + v, next, out);
      else vector_by_rows<MR, FMT, false>(x, row0, K, block, v0 + v, next, out);
    } else {
      vector_by_rows<MR, FMT, false>(x, row0, K, block, v0 + v, nullptr, out);
    }
    for (int j = 0; j < MR; ++j) acc[j][v] = out[j];
  }
  store_tile<MR, NV>(acc, v0, valid, bias, y, ldy);
}
