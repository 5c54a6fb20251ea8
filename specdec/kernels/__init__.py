"""specdec's CPU kernels: a batch-invariant float32 Llama forward, compiled on first use.

`load()` builds cpu_llama.cpp with torch's C++ extension tools into the specdec cache (once per
source version and CPU), or raises KernelUnavailable with the reason (no AVX2, no compiler, ...). The build is
for AVX-512 where the CPU has it, else for AVX2 (vec16.h); bfloat16 products need AVX-512 BF16 either way. An
AVX-512 build on a CPU with AVX-512 VNNI also uses its integer dot products (vpdpbusd) for the drafting copy.
"""

from __future__ import annotations

import hashlib
import os
import sys
from functools import lru_cache
from pathlib import Path

from ..errors import ConfigError, SpecdecError, first_line

SOURCE = Path(__file__).with_name("cpu_llama.cpp")
HEADERS = tuple(
    Path(__file__).with_name(name)
    for name in (
        "vec16.h",
        "products.h",
        "amx.h",
        "quantized_layout.h",
        "int8_lanes.h",
        "quantized_steps.h",
        "quantized_rows.h",
        "quantized.h",
        "drafting_head.h",
        "weights.h",
        "argmax_screen.h",
        "row_ops.h",
        "kv_cache.h",
        "attention.h",
        "attention_split.h",
        "layers.h",
        "head_layer.h",
        "bindings.h",
    )
)
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "f16c", "fma")
AVX2_FLAGS = ("avx2", "f16c", "fma")
ISA_VARIABLE, PREFILL_VARIABLE = "SPECDEC_KERNEL_ISA", "SPECDEC_BF16_PREFILL"
BUILD_FLAGS = {
    "avx512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mf16c"],
    "avx2": ["-mavx2", "-mfma", "-mf16c"],
}


class KernelUnavailable(SpecdecError):
    """The CPU kernels cannot be built or run here."""


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def build_flags(isa: str) -> list[str]:
    """The compiler's instruction-set flags for an `isa` build on this CPU. VNNI is added only where the CPU has
    it, since the compiler may then use it anywhere in the build; the build's cache tag includes these flags."""
    flags = list(BUILD_FLAGS[isa])
    if isa == "avx512" and "avx512_vnni" in cpu_flags():
        flags.append("-mavx512vnni")
    return flags


def has_bf16_products() -> bool:
    """True where the CPU has AVX-512 BF16 (vdpbf16ps) and the build is AVX-512's, for bfloat16 products."""
    return "avx512_bf16" in cpu_flags() and instruction_set() == "avx512"


def bf16_prefill_wanted() -> bool:
    """Whether prompts' passes take bfloat16 products where the weights and CPU allow them (KernelLlama's default):
    yes, unless SPECDEC_BF16_PREFILL is "off"; "on" (or unset) asks for them, which a CPU without them cannot give.
    Any other value is a ConfigError."""
    value = os.environ.get(PREFILL_VARIABLE, "").strip().lower()
    if value not in ("", "on", "off"):
        raise ConfigError(f"{PREFILL_VARIABLE} must be on or off, not {value!r}")
    return value != "off"


def cpu_instruction_set() -> str | None:
    """The best build this CPU runs, whatever SPECDEC_KERNEL_ISA says: "avx512", "avx2", or None (neither)."""
    flags = cpu_flags()
    for name, needed in (("avx512", AVX512_FLAGS), ("avx2", AVX2_FLAGS)):
        if all(f in flags for f in needed):
            return name
    return None


def forced_instruction_set() -> str | None:
    """The build SPECDEC_KERNEL_ISA asks for ("avx2" or "avx512"), None where it is unset or empty; any other value is
    a ConfigError (a typo must not quietly test the native build)."""
    value = os.environ.get(ISA_VARIABLE, "").strip().lower()
    if value and value not in BUILD_FLAGS:
        raise ConfigError(f"{ISA_VARIABLE} must be one of {', '.join(BUILD_FLAGS)}, not {value!r}")
    return value or None


def instruction_set() -> str | None:
    """The vector instructions the kernels are built for here: the CPU's best, or SPECDEC_KERNEL_ISA's build where
    that is set; None where the CPU runs neither (or not the one asked for)."""
    forced, best = forced_instruction_set(), cpu_instruction_set()
    if forced is None or best is None:
        return best
    return None if forced == "avx512" and best != "avx512" else forced  # an AVX-512 CPU runs the AVX2 build too


def unavailable_reason() -> str | None:
    """Why the kernels cannot run on this machine, or None."""
    if sys.platform != "linux":
        return "the CPU kernels are built for Linux only"
    if instruction_set() is None:
        flags = cpu_flags()
        if forced_instruction_set() == "avx512" and cpu_instruction_set() == "avx2":
            return f"{ISA_VARIABLE}=avx512, but the CPU lacks {', '.join(f for f in AVX512_FLAGS if f not in flags)}"
        return f"the CPU lacks {', '.join(f for f in AVX2_FLAGS if f not in flags)}"
    for path in (SOURCE, *HEADERS):
        if not path.is_file():
            return f"the kernel source {path.name} is not installed"
    return None


def _openmp_link_flags() -> list[str]:
    """Links the OpenMP runtime torch ships, so that the process runs a single one (ATen's parallel_for
    is a header template: the extension must be compiled with OpenMP for it to run in parallel)."""
    import torch

    lib = Path(torch.__file__).parent / "lib"
    for pattern in ("libgomp*.so*", "libiomp5*.so*"):
        found = sorted(lib.glob(pattern))
        if found:
            return [f"-L{lib}", f"-l:{found[0].name}", f"-Wl,-rpath,{lib}"]
    return ["-fopenmp"]


def load(isa: str | None = None):
    """The compiled extension module (built on first call, then loaded from the cache). isa: build for "avx2"
    or "avx512" instead of instruction_set()'s (for comparisons; the CPU must run the one asked for). Without
    isa, SPECDEC_KERNEL_ISA chooses where set (KernelUnavailable where the CPU cannot run that build)."""
    reason = unavailable_reason()
    if reason:
        raise KernelUnavailable(reason)
    if isa is not None and isa not in BUILD_FLAGS:
        raise ValueError(f"isa must be one of {', '.join(BUILD_FLAGS)}, not {isa!r}")
    if isa == "avx512" and cpu_instruction_set() != "avx512":
        raise KernelUnavailable("the CPU lacks AVX-512")
    return _build(isa or instruction_set())


@lru_cache(maxsize=2)
def _build(isa: str):
    from torch.utils import cpp_extension

    from ..files import cache_root

    source = b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))
    flags = build_flags(isa)
    # the sources' folder too: torch's build files name the source by its path, so two installs of the same sources
    # (a checkout and a venv) sharing one build folder would each rebuild it (a minute) whenever the other had run
    where = str(SOURCE.parent.resolve()).encode()
    tag = hashlib.sha256(source + " ".join(flags).encode() + b"\0" + where).hexdigest()[:12]
    build_dir = cache_root() / "kernels" / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    first = not any(build_dir.glob("*.so"))
    if first:
        print("specdec: compiling CPU kernels (once, about a minute)...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=f"specdec_cpu_llama_{tag}",
            sources=[str(SOURCE)],
            build_directory=str(build_dir),
            extra_cflags=["-O3", *flags, "-ffp-contract=off", "-fopenmp"],
            extra_ldflags=_openmp_link_flags(),
            verbose=bool(os.environ.get("SPECDEC_VERBOSE_BUILD")),
        )
    except (RuntimeError, OSError, ImportError) as exc:
        raise KernelUnavailable(f"building the CPU kernels failed: {first_line(exc)}") from None
