"""The device and dtype a model loads on and in: what may be asked for, and what "auto" stands for on this machine."""

from __future__ import annotations

from pathlib import Path

import torch

from ..config import DTYPES, check
from ..errors import ConfigError

DEVICES = ("auto", "cpu", "cuda")


def check_device_dtype(device: str, dtype: str) -> None:
    """Refuses (ConfigError) a device or dtype a model cannot be loaded on or in."""
    check(
        device in DEVICES or device.startswith("cuda:"), f"device must be one of {', '.join(DEVICES)}, got {device!r}"
    )
    check(dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    return torch.device(device)


def cpu_has_bf16() -> bool:
    """True where the CPU computes bfloat16 natively (AVX-512 BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on GPUs and CPUs that compute it natively, else float32."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    return getattr(torch, dtype)
