// bfloat16 products on AMX tiles, where the CPU and the OS allow them. Part of cpu_llama.cpp's translation unit,
// included after products.h.
#pragma once

// ---- bfloat16 products on AMX tiles ----------------------------------------------------------------------
// Where the CPU and OS allow it, bfloat16 products (BF16DOT's: x rounded to bfloat16) run on AMX tiles, 16 rows of
// x at a time. TDPBF16PS sums each output over pairs of k into one float32, reading the packed pair layout as it is
// (a block's 16 columns of 16 pairs are one tile, rows 256 bytes apart), at a small fraction of the AVX-512
// products' cost, so a pass over tens of tokens costs little more than reading the weights. Its sums round
// differently from vdpbf16ps's (last bits), so the choice depends only on the machine and K (a multiple of 32), never
// on how many rows are multiplied: passes stay batch-invariant.

#if defined(SPECDEC_AVX512) && !defined(SPECDEC_NO_AMX) && ((defined(__clang__) && __clang_major__ >= 12) || \
                                  (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define SPECDEC_AMX 1  // the compiler has the AMX intrinsics
#endif

#ifndef SPECDEC_AMX
bool amx_permitted() { return false; }
#else
bool amx_permitted() {
  static const bool ok = [] {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
    constexpr long kReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux: ask for the tile data state
    return syscall(SYS_arch_prctl, kReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}
#endif

bool amx_enabled = true;  // set_amx turns it off, for comparisons with the AVX-512 products

#ifdef SPECDEC_AMX
bool use_amx(int64_t K) { return amx_enabled && K % 32 == 0 && amx_permitted(); }
#endif

// how far ahead of the tiles the weights are fetched into cache (tile loads are not prefetched by the hardware as
// vector loads are); 8 KB measured best on the build machine's two shared cores (4 to 32 KB tried)
constexpr int64_t kPrefetchAhead = 8192;

#ifdef SPECDEC_AMX
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tiles 0-3: float32 outputs (16 rows x 16 columns); 4: x (16 rows x 32 k); 5-7: weights (16 pairs x 16 columns)
constexpr TileConfig tile_shapes() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  return cfg;
}
// a static object: ldtilecfg reads memory the compiler does not know it reads, so a local could be left unwritten
const TileConfig kTileShapes = tile_shapes();

__attribute__((target("amx-tile"))) void amx_start() { _tile_loadconfig(&kTileShapes); }

__attribute__((target("amx-tile"))) void amx_end() { _tile_release(); }

// y rows [0, M), the block's columns [0, valid) = x @ W^T (+ bias); x bfloat16 (M rounded up to 16 rows, zeros).
// end: where the weights this thread multiplies end (its blocks are contiguous), for the prefetches.
__attribute__((target("amx-tile,amx-bf16"))) void amx_block(const uint16_t* x, int64_t M, int64_t K,
                                                           const char* block, const char* end, int valid,
                                                           const float* bias, float* y, int64_t ldy) {
  alignas(64) float out[16 * kBlockCols];
  for (int64_t m = 0; m < M; m += 16) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k = 0; k < K; k += 32) {
      const char* w = block + k * kBlockCols * 2;  // pair k/2 of every column: 256 bytes a pair
      if (m == 0 && w + kPrefetchAhead < end)
        for (int line = 0; line < 32 * kBlockCols * 2; line += 64) _mm_prefetch(w + kPrefetchAhead + line, _MM_HINT_T0);
      _tile_loadd(4, x + m * K + k, K * 2);
      _tile_loadd(5, w, 256);
      _tile_loadd(6, w + 64, 256);
      _tile_loadd(7, w + 128, 256);
      _tile_dpbf16ps(0, 4, 5);
      _tile_dpbf16ps(1, 4, 6);
      _tile_loadd(5, w + 192, 256);
      _tile_dpbf16ps(2, 4, 7);
      _tile_dpbf16ps(3, 4, 5);
    }
    _tile_stored(0, out, kBlockCols * 4);
    _tile_stored(1, out + 16, kBlockCols * 4);
    _tile_stored(2, out + 32, kBlockCols * 4);
    _tile_stored(3, out + 48, kBlockCols * 4);
    const int64_t rows = std::min<int64_t>(16, M - m);
    for (int v = 0; v < kVecs; ++v) {
      const int live = live_lanes(valid, v);
      if (!live) break;
      const f32x16 b = bias_lanes(bias, v, live);
      for (int64_t r = 0; r < rows; ++r)
        vec::store_first(live, y + (m + r) * ldy + v * 16, vec::add(vec::load(out + r * kBlockCols + v * 16), b));
    }
  }
}

// linear_blocks<BF16DOT> on AMX tiles: y (M, ldy) columns [0, N) = bfloat16(x) (M, K) @ W^T (+ bias);
// W bfloat16 packed in pairs, K a multiple of 32
void linear_amx(const float* x, int64_t M, const char* packed, int64_t N, int64_t K, const float* bias, float* y,
                int64_t ldy) {
  const std::vector<uint16_t> xb = to_bf16(x, M * K, (-M & 15) * K);  // zero rows up to a multiple of 16
  const int64_t block_bytes = kBlockCols * K * 2;
  const int64_t blocks = (N + kBlockCols - 1) / kBlockCols;
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    amx_start();
    const char* first = packed + b0 * block_bytes;  // the blocks' loads prefetch what follows them, not themselves
    for (int64_t line = 0; line < std::min(kPrefetchAhead, (b1 - b0) * block_bytes); line += 64)
      _mm_prefetch(first + line, _MM_HINT_T0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t n = b * kBlockCols;
      const int valid = static_cast<int>(std::min<int64_t>(kBlockCols, N - n));
      amx_block(xb.data(), M, K, packed + b * block_bytes, packed + b1 * block_bytes, valid,
                bias ? bias + n : nullptr, y + n, ldy);
    }
    amx_end();
  });
}
#endif  // SPECDEC_AMX
