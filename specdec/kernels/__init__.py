"""specdec's CPU kernels: a batch-invariant float32 Llama forward, compiled on first use.

`load()` builds cpu_llama.cpp with torch's C++ extension tools into the specdec cache (once per
source version and CPU), or raises KernelUnavailable with the reason (no AVX-512, no compiler, ...).
"""
from __future__ import annotations

import hashlib
import os
import sys
from functools import lru_cache
from pathlib import Path

from ..errors import SpecdecError, first_line

SOURCE = Path(__file__).with_name("cpu_llama.cpp")
REQUIRED_FLAGS = ("avx512f", "avx512bw", "avx512vl", "f16c", "fma")


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


def has_bf16_products() -> bool:
    """True where the CPU has AVX-512 BF16 (vdpbf16ps), for bfloat16 products."""
    return "avx512_bf16" in cpu_flags()


def unavailable_reason() -> str | None:
    """Why the kernels cannot run on this machine, or None."""
    if sys.platform != "linux":
        return "the CPU kernels are built for Linux only"
    missing = [f for f in REQUIRED_FLAGS if f not in cpu_flags()]
    if missing:
        return f"the CPU lacks {', '.join(missing)}"
    if not SOURCE.is_file():
        return f"the kernel source {SOURCE.name} is not installed"
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


@lru_cache(maxsize=1)
def load():
    """The compiled extension module (built on first call, then loaded from the cache)."""
    reason = unavailable_reason()
    if reason:
        raise KernelUnavailable(reason)
    from torch.utils import cpp_extension

    from ..models.registry import cache_root

    source = SOURCE.read_bytes()
    tag = hashlib.sha256(source + " ".join(sorted(cpu_flags() & set(REQUIRED_FLAGS))).encode()).hexdigest()[:12]
    build_dir = cache_root() / "kernels" / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    first = not any(build_dir.glob("*.so"))
    if first:
        print("specdec: compiling CPU kernels (once, about a minute)...", file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(
            name=f"specdec_cpu_llama_{tag}", sources=[str(SOURCE)], build_directory=str(build_dir),
            extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-mfma", "-mf16c",
                          "-ffp-contract=off", "-fopenmp"],
            extra_ldflags=_openmp_link_flags(),
            verbose=bool(os.environ.get("SPECDEC_VERBOSE_BUILD")))
    except (RuntimeError, OSError, ImportError) as exc:
        raise KernelUnavailable(f"building the CPU kernels failed: {first_line(exc)}") from None
