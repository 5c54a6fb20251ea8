"""The CPU kernels are built for AVX-512 where the CPU has it and for AVX2 elsewhere: both builds keep every row's
products independent of the rows beside it, and the AVX2 build agrees with the AVX-512 one up to rounding."""
import pytest
import torch

from specdec import kernels
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder

from tiny import loaded, tiny_llama

AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx2", "f16c", "fma"}


@pytest.mark.parametrize("flags,isa", [(AVX512, "avx512"), (AVX512 - {"avx512bw"}, "avx2"),
                                       ({"avx2", "fma", "f16c", "sse4_2"}, "avx2"), ({"avx", "sse4_2"}, None)])
def test_the_build_follows_the_cpu_flags(monkeypatch, flags, isa):
    monkeypatch.delenv(kernels.ISA_VARIABLE, raising=False)  # CI reruns the kernels' tests with it set
    monkeypatch.setattr(kernels, "cpu_flags", lambda: set(flags))
    assert kernels.instruction_set() == isa
    reason = kernels.unavailable_reason()
    if isa is None:
        assert reason == "the CPU lacks avx2, f16c, fma"
    else:
        assert reason is None or "Linux" in reason
    assert not kernels.has_bf16_products()  # none of these has AVX-512 BF16


@pytest.mark.parametrize("flags,isa,vnni", [(AVX512 | {"avx512_vnni"}, "avx512", True), (AVX512, "avx512", False),
                                            (AVX512 | {"avx512_vnni"}, "avx2", False)])
def test_vnni_is_compiled_in_only_where_the_cpu_has_it(monkeypatch, flags, isa, vnni):
    """-mavx512vnni lets the compiler use VNNI anywhere in the build, so only a CPU that has it may get it (and the
    flags are part of the build's cache tag, so a cache shared by two CPUs keeps two builds)."""
    monkeypatch.setattr(kernels, "cpu_flags", lambda: set(flags))
    assert ("-mavx512vnni" in kernels.build_flags(isa)) == vnni
    assert kernels.build_flags(isa)[: len(kernels.BUILD_FLAGS[isa])] == kernels.BUILD_FLAGS[isa]


def test_an_unknown_or_unsupported_build_is_refused(monkeypatch):
    if kernels.unavailable_reason():
        pytest.skip(kernels.unavailable_reason())
    with pytest.raises(ValueError, match="isa must be one of avx512, avx2"):
        kernels.load("sse2")
    if kernels.cpu_instruction_set() != "avx512":  # the CPU's own, whichever build SPECDEC_KERNEL_ISA chose
        with pytest.raises(kernels.KernelUnavailable, match="lacks AVX-512"):
            kernels.load("avx512")


def _build(isa=None):
    try:
        return kernels.load(isa)
    except kernels.KernelUnavailable as exc:
        pytest.skip(str(exc))


def _builds():
    """This CPU's build, then the AVX2 build where that is another one."""
    best = _build()
    return [best] + ([_build("avx2")] if kernels.instruction_set() == "avx512" else [])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("out_features,in_features", [(200, 96), (70, 576), (16, 1536)])
def test_each_row_of_a_product_equals_that_row_alone_in_every_build(dtype, out_features, in_features):
    torch.manual_seed(0)
    weight, bias = torch.randn(out_features, in_features).to(dtype), torch.randn(out_features)
    x = torch.randn(13, in_features)
    want = x @ weight.float().T + bias
    for module in _builds():
        linear = module.PackedLinear(weight, bias, False)
        together = linear(x)
        torch.testing.assert_close(together, want, rtol=1e-4, atol=1e-4 * in_features ** 0.5)
        for r in (0, 1, 5, 12):
            assert torch.equal(linear(x[r:r + 1])[0], together[r])
        assert torch.equal(linear(x[3:10]), together[3:10])


def test_the_avx2_build_runs_the_model_as_the_avx512_one_does_and_speculation_changes_nothing(monkeypatch):
    """A tiny Llama on each build: logits within float32 rounding of each other, and on the AVX2 build speculation's
    output equals plain decoding token for token."""
    if kernels.instruction_set() != "avx512":
        pytest.skip("only a CPU with AVX-512 runs both builds")
    best, avx2 = _build(), _build("avx2")
    prompt = torch.randint(0, 63, (37,), generator=torch.Generator().manual_seed(1)).tolist()

    def run(module):
        monkeypatch.setattr(kernels, "load", lambda isa=None: module)
        target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2), "kernels")
        cache = target.backend.new_cache()
        logits = target.backend.forward(cache, torch.tensor(prompt)).logits
        config = GenerationConfig(max_new_tokens=32, ignore_eos=True)
        plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
        spec, _ = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(num_speculative_tokens=4)).generate_ids(
            prompt, config)
        return logits, plain, spec

    (wide, wide_plain, _), (narrow, narrow_plain, narrow_spec) = run(best), run(avx2)
    torch.testing.assert_close(narrow, wide, rtol=1e-4, atol=1e-4)
    assert narrow_spec == narrow_plain and len(narrow_plain) == 32
