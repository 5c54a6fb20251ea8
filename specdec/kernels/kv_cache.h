// The KV cache's entries: float32 or bfloat16 (uint16_t), per layer (slots, kv_heads, P, head_dim), keys in blocks
// of 16 positions ([P/16][head_dim][16]), values as rows ([P][head_dim]). Part of cpu_llama.cpp's translation unit.
#pragma once

// A cache entry widened to float32.
template <typename KV>
inline f32x16 load_kv(const KV* p) {
  if constexpr (std::is_same_v<KV, float>) return vec::load(p);
  else return vec::load_bf16(p);
}

// float32 -> the cache's type (bfloat16: rounded to nearest even, as torch rounds)
template <typename KV>
inline KV to_kv(float x) {
  if constexpr (std::is_same_v<KV, float>) {
    return x;
  } else {
    uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN stays NaN
    return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
  }
}

// Moves entries start + keep[i] to start + i in one slot (tree path compaction), all L layers and nkv heads.
template <typename KV>
void compact_entries(KV* kc, KV* vc, int64_t L, int64_t slots, int64_t nkv, int64_t P, int64_t hd, int64_t slot,
                     int64_t start, const std::vector<int64_t>& keep) {
  for (int64_t l = 0; l < L; ++l)
    for (int64_t g = 0; g < nkv; ++g) {
      const int64_t head = ((l * slots + slot) * nkv + g) * P * hd;
      for (size_t i = 0; i < keep.size(); ++i) {
        const int64_t from = start + keep[i], to = start + static_cast<int64_t>(i);
        if (from == to) continue;
        for (int64_t d = 0; d < hd; ++d)
          kc[head + (to / 16) * hd * 16 + d * 16 + to % 16] = kc[head + (from / 16) * hd * 16 + d * 16 + from % 16];
        std::copy(vc + head + from * hd, vc + head + (from + 1) * hd, vc + head + to * hd);
      }
    }
}
