"""The kernels' AVX-512 build, run on a CPU without AVX-512: its intrinsics emulated by SIMDe (SIMD Everywhere,
Debian's libsimde-dev, header-only), so that the AVX-512 and VNNI code paths are executed, not only compiled, on the
AVX2 machines most tests run on.

The sources are copied with the compiler's AVX-512 macros renamed (`__AVX512F__` -> `SPECDEC_EMULATED_AVX512`, and
VNNI's likewise), so that the build takes its AVX-512 branches while the compiler targets AVX2, and SIMDe's "native
aliases" turn each `_mm512_*` call into SIMDe's portable version. A few intrinsics SIMDe 0.7 lacks are written out
below, lane by lane, as Intel documents them; `_mm512_reduce_add_ps` follows GCC's own tree (halves of 256, then of
128 bits, then pairs), which is the order the AVX-512 build's sums take. The one empty asm that pins a register
(int8_lanes.h's `qv::pin`) cannot hold an emulated 512-bit value and goes: it changes speed only. AMX code compiles as
it is and never runs (no tile permission without AMX).

SIMDe's headers are looked for in SPECDEC_SIMDE_INCLUDE, else /usr/include; without them `build` returns None.
"""
from __future__ import annotations

import fcntl
import hashlib
import os
from pathlib import Path

SHIM = r'''
#ifdef SPECDEC_EMULATED_AVX512
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <cstring>
// Intrinsics SIMDe 0.7 does not alias, lane by lane
template <class R, class E> static inline R emulated_from(const E* lanes) { R r; std::memcpy(&r, lanes, sizeof(R)); return r; }
static inline simde__m512 emulated_cvtepi32_ps(simde__m512i a) {
  int32_t v[16]; float f[16]; std::memcpy(v, &a, 64);
  for (int i = 0; i < 16; ++i) f[i] = static_cast<float>(v[i]);  // rounded as MXCSR says, as vcvtdq2ps does
  return emulated_from<simde__m512>(f);
}
template <class Lane, class In> static inline simde__m512i emulated_widen(In a) {  // 16 lanes to int32
  Lane b[16]; int32_t o[16]; std::memcpy(b, &a, sizeof(b));
  for (int i = 0; i < 16; ++i) o[i] = b[i];
  return emulated_from<simde__m512i>(o);
}
static inline simde__m512 emulated_cvtph_ps(simde__m256i a) {
  __m128i halves[2]; std::memcpy(halves, &a, 32);
  const __m256 f[2] = {_mm256_cvtph_ps(halves[0]), _mm256_cvtph_ps(halves[1])};
  return emulated_from<simde__m512>(f);
}
static inline void emulated_mask_storeu_ps(float* p, uint16_t mask, simde__m512 v) {
  float f[16]; std::memcpy(f, &v, 64);
  for (int i = 0; i < 16; ++i) if (mask >> i & 1) p[i] = f[i];
}
static inline simde__m512 emulated_maskz_loadu_ps(uint16_t mask, const float* p) {
  float f[16];
  for (int i = 0; i < 16; ++i) f[i] = (mask >> i & 1) ? p[i] : 0.f;
  return emulated_from<simde__m512>(f);
}
static inline float emulated_reduce_add_ps(simde__m512 v) {
  float f[16], a[8], b[4];
  std::memcpy(f, &v, 64);
  for (int i = 0; i < 8; ++i) a[i] = f[i + 8] + f[i];
  for (int i = 0; i < 4; ++i) b[i] = a[i + 4] + a[i];
  return (b[0] + b[2]) + (b[1] + b[3]);
}
static inline simde__m512i emulated_shuffle_epi32(simde__m512i a, int imm) {
  int32_t x[16], o[16]; std::memcpy(x, &a, 64);
  for (int lane = 0; lane < 4; ++lane)
    for (int i = 0; i < 4; ++i) o[4 * lane + i] = x[4 * lane + ((imm >> (2 * i)) & 3)];
  return emulated_from<simde__m512i>(o);
}
static inline simde__m256i emulated_cvtneps_pbh(simde__m512 v) {
  float f[16]; uint16_t o[16]; std::memcpy(f, &v, 64);
  for (int i = 0; i < 16; ++i) {
    uint32_t u; std::memcpy(&u, &f[i], 4);
    o[i] = (u & 0x7fffffff) > 0x7f800000 ? static_cast<uint16_t>((u >> 16) | 0x40)  // NaN, kept quiet
                                         : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
  }
  return emulated_from<simde__m256i>(o);
}
template <class T, class V> static inline T emulated_as(const V& v) { T t; std::memcpy(&t, &v, sizeof(T)); return t; }
#define _mm512_cvtepi32_ps(a) emulated_cvtepi32_ps(a)
#define _mm512_cvtepi8_epi32(a) emulated_widen<int8_t>(a)
#define _mm512_cvtepu8_epi32(a) emulated_widen<uint8_t>(a)
#define _mm512_cvtepu16_epi32(a) emulated_widen<uint16_t>(a)
#define _mm512_cvtph_ps(a) emulated_cvtph_ps(a)
#define _mm512_mask_storeu_ps(p, mask, v) emulated_mask_storeu_ps(p, mask, v)
#define _mm512_maskz_loadu_ps(mask, p) emulated_maskz_loadu_ps(mask, p)
#define _mm512_reduce_add_ps(v) emulated_reduce_add_ps(v)
#define _mm512_shuffle_epi32(a, imm) emulated_shuffle_epi32(a, static_cast<int>(imm))
#define _mm512_cvtneps_pbh(v) emulated_as<__m256bh>(emulated_cvtneps_pbh(v))
// SIMDe 0.7.4 aliases the masked form's four arguments under the plain name
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#endif
'''
PIN = 'inline void pin(i32x16& v) { asm("" : "+v"(v)); }'


def simde_include() -> Path | None:
    """The folder holding simde/x86/avx512.h, or None."""
    for folder in (os.environ.get("SPECDEC_SIMDE_INCLUDE"), "/usr/include"):
        if folder and (Path(folder) / "simde" / "x86" / "avx512.h").is_file():
            return Path(folder)
    return None


def emulated_sources(into: Path, vnni: bool) -> Path:
    """The kernels' sources, copied into `into` and made to take their AVX-512 (and VNNI) branches under SIMDe:
    the path of the copied cpu_llama.cpp. A file already holding its text is left as it is, so that a build made
    from it is not redone."""
    from specdec import kernels

    into.mkdir(parents=True, exist_ok=True)
    for path in (kernels.SOURCE, *kernels.HEADERS):
        text = path.read_text().replace("__AVX512F__", "SPECDEC_EMULATED_AVX512")
        text = text.replace("__AVX512VNNI__", "SPECDEC_EMULATED_VNNI" if vnni else "SPECDEC_NO_VNNI")
        if path.name == "vec16.h":
            assert "#include <immintrin.h>\n" in text
            text = text.replace("#include <immintrin.h>\n", "#include <immintrin.h>\n" + SHIM, 1)
        if path.name == "int8_lanes.h":
            assert PIN in text, "int8_lanes.h's qv::pin changed: update tests/emulated_avx512.py"
            text = text.replace(PIN, "inline void pin(i32x16&) {}")
        copy = into / path.name
        if not copy.is_file() or copy.read_text() != text:
            copy.write_text(text)
    return into / kernels.SOURCE.name


def build(vnni: bool = True):
    """The emulated AVX-512 build's module (compiled once per source version into specdec's cache, a few
    minutes), or None where SIMDe's headers are missing."""
    from torch.utils import cpp_extension

    from specdec import kernels
    from specdec.files import cache_root

    include = simde_include()
    if include is None:
        return None
    source = b"".join(path.read_bytes() for path in (kernels.SOURCE, *kernels.HEADERS))
    tag = hashlib.sha256(source + SHIM.encode() + f"{vnni} {include}".encode()).hexdigest()[:12]
    folder = cache_root() / "kernels" / f"emulated-avx512-{tag}"
    folder.mkdir(parents=True, exist_ok=True)
    flags = ["-O2", *kernels.BUILD_FLAGS["avx2"], "-ffp-contract=off", "-fopenmp", "-w",
             "-DSPECDEC_EMULATED_AVX512", f"-I{include}"]
    # pytest-xdist's workers each build the module: one at a time, the later ones loading the first one's build
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        main = emulated_sources(folder / "src", vnni)
        return cpp_extension.load(name=f"specdec_emulated_avx512_{tag}", sources=[str(main)],
                                  build_directory=str(folder), extra_cflags=flags, extra_ldflags=["-fopenmp"])
