"""SPECDEC_KERNEL_ISA and SPECDEC_BF16_PREFILL: one CPU runs the kernels as a CPU with fewer instructions would (the
AVX2 build, no bfloat16 prefill), so that CI can rerun the kernels' tests that way (.ci/run). The CPU's flags and
the compiled kernels are stood in for, so these hold on any machine."""
import pytest
import torch

from specdec import kernels
from specdec.errors import ConfigError
from specdec.models.kernel_args import kernel_model_args
from specdec.models.kernel_llama import KernelLlama
from specdec.models.loading import model_info

from tiny import _NoTokenizer, tiny_llama

SAPPHIRE_RAPIDS = {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "amx_bf16"}
ZEN3 = {"avx2", "fma", "f16c", "sse4_2"}


@pytest.fixture(autouse=True)
def unset(monkeypatch):
    """Neither variable set (CI reruns the suite with them set)."""
    monkeypatch.delenv(kernels.ISA_VARIABLE, raising=False)
    monkeypatch.delenv(kernels.PREFILL_VARIABLE, raising=False)


def _cpu(monkeypatch, flags: set[str]) -> None:
    monkeypatch.setattr(kernels, "cpu_flags", lambda: set(flags))


def test_the_avx2_build_asked_for_on_an_avx512_cpu_is_the_one_built_and_reported(monkeypatch):
    _cpu(monkeypatch, SAPPHIRE_RAPIDS)
    built = []
    monkeypatch.setattr(kernels, "_build", built.append)  # records the build load() asks for, compiles nothing
    assert kernels.instruction_set() == "avx512" and kernels.has_bf16_products()
    kernels.load()
    monkeypatch.setenv(kernels.ISA_VARIABLE, "avx2")
    assert kernels.instruction_set() == "avx2" and kernels.cpu_instruction_set() == "avx512"
    assert not kernels.has_bf16_products()  # the AVX2 build has no bfloat16 products
    kernels.load()
    kernels.load("avx512")  # an explicit build still wins
    assert built == ["avx512", "avx2", "avx512"]


def test_a_build_the_cpu_cannot_run_is_refused_and_a_misspelt_one_is_an_error(monkeypatch):
    _cpu(monkeypatch, ZEN3)
    monkeypatch.setenv(kernels.ISA_VARIABLE, "avx512")
    assert kernels.instruction_set() is None and not kernels.has_bf16_products()
    reason = "SPECDEC_KERNEL_ISA=avx512, but the CPU lacks avx512f, avx512bw, avx512vl"
    assert kernels.unavailable_reason() == reason
    with pytest.raises(kernels.KernelUnavailable, match=reason):
        kernels.load()
    monkeypatch.setenv(kernels.ISA_VARIABLE, "avx2")
    assert kernels.instruction_set() == "avx2" and kernels.unavailable_reason() is None
    monkeypatch.setenv(kernels.ISA_VARIABLE, "avx-512")
    for call in (kernels.instruction_set, kernels.unavailable_reason, kernels.load):
        with pytest.raises(ConfigError, match="SPECDEC_KERNEL_ISA must be one of avx512, avx2, not 'avx-512'"):
            call()


class _Module:
    """A stand-in for the compiled kernels: its CpuLlama records whether the weights were packed for bfloat16
    products, which only an AVX-512 build can do."""

    def __init__(self, model_args: int):
        self.model_args, self.pairs = model_args, []

    def CpuLlama(self, *args):
        self.pairs.append(args[self.model_args])  # the first flag after kernel_model_args' arguments
        return type("Model", (), {"screened": False})()


def _bf16_prefill(monkeypatch, bf16_products_here: bool, **options) -> tuple[bool, bool]:
    """A tiny bfloat16 KernelLlama's bf16_prefill, and whether its weights were packed for bfloat16 products."""
    model = tiny_llama(seed=1, hidden=64, heads=4, kv_heads=2).to(torch.bfloat16)
    module = _Module(len(kernel_model_args(model, 16)))
    monkeypatch.setattr(kernels, "load", lambda isa=None: module)
    monkeypatch.setattr(kernels, "has_bf16_products", lambda: bf16_products_here)
    info = model_info("tiny", model, _NoTokenizer(model), torch.device("cpu"), torch.bfloat16)
    backend = KernelLlama(model, info, **options)
    return backend.bf16_prefill, module.pairs[0]


@pytest.mark.parametrize("setting,here,want", [(None, True, True), ("on", True, True), ("off", True, False),
                                               ("on", False, False), ("OFF", True, False), (None, False, False)])
def test_the_bf16_prefill_follows_the_variable_where_the_cpu_allows_it(monkeypatch, setting, here, want):
    if setting:
        monkeypatch.setenv(kernels.PREFILL_VARIABLE, setting)
    assert _bf16_prefill(monkeypatch, here) == (want, want)
    assert _bf16_prefill(monkeypatch, here, bf16_prefill=False) == (False, False)  # an explicit choice wins
    monkeypatch.setenv(kernels.PREFILL_VARIABLE, "no")
    with pytest.raises(ConfigError, match="SPECDEC_BF16_PREFILL must be on or off, not 'no'"):
        _bf16_prefill(monkeypatch, here)

