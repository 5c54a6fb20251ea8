"""The AVX-512 build, with and without VNNI, computes the AVX2 build's bits: run, not only compiled, on a CPU
without AVX-512 or without VNNI, its intrinsics emulated by SIMDe (tests/emulated_avx512.py).

The two builds are meant to do the same float32 operation in each of 16 lanes, and the same integer sums (VNNI's
dpbusd, or pairs summed in 16 bits), so every product and every pass agrees to the bit. These tests hold the AVX-512
branches to that: each GGUF format's products for one and several rows, float32, bfloat16 and float16 products, a
tiny Llama's logits and its 4-bit drafting copy's, a quantized GGUF model's logits, and speculation's output on the
AVX-512 build equal to plain decoding. Skipped where SIMDe's headers are missing (Debian's libsimde-dev; .ci/run
fetches them); a variant the CPU runs itself is skipped too (tests/test_kernels_isa.py compares both builds there).
"""
import pytest
import torch

from emulated_avx512 import build, simde_include
from specdec.models.gguf_blocks import READERS, read_rows
from specdec.models.quantized_args import pack_rows
from tiny import loaded, tiny_llama

kernels = pytest.importorskip("specdec.kernels")
if kernels.unavailable_reason():
    pytest.skip(kernels.unavailable_reason(), allow_module_level=True)
if simde_include() is None:
    pytest.skip("SIMDe's headers (Debian's libsimde-dev) are missing: set SPECDEC_SIMDE_INCLUDE",
                allow_module_level=True)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=[True, False], ids=["vnni", "no-vnni"])
def emulated(request):
    """The AVX-512 build with or without VNNI under SIMDe; skipped where it is the CPU's own build (an AVX-512 CPU
    with VNNI still has the branches without it emulated here, and one without VNNI those with it)."""
    native = kernels.cpu_instruction_set() == "avx512" and ("avx512_vnni" in kernels.cpu_flags()) == request.param
    if native:
        pytest.skip("the CPU runs this build itself (tests/test_kernels_isa.py compares it with the AVX2 build)")
    return build(vnni=request.param)


@pytest.fixture(scope="module")
def avx2():
    return kernels.load("avx2")


@pytest.mark.parametrize("kind", list(READERS))
def test_each_formats_products_are_the_avx2_builds(emulated, avx2, kind):
    from test_gguf_kernels import random_blocks

    for n in (64 * 9, 200):  # blocks shared by halves among the threads, and by whole blocks with a part block
        quantized = read_rows(kind, random_blocks(kind, n, 512, seed=7))
        for rows in (1, 3, 16):
            x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
            want = avx2.packed_matmul(x, pack_rows(avx2, quantized), quantized.fmt, n, 512)
            got = emulated.packed_matmul(x, pack_rows(emulated, quantized), quantized.fmt, n, 512)
            assert torch.equal(got, want), (kind, n, rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_float_products_are_the_avx2_builds(emulated, avx2, dtype):
    weight, bias = torch.randn(70, 576).to(dtype), torch.randn(70)
    x = torch.randn(5, 576)
    assert torch.equal(emulated.PackedLinear(weight, bias, False)(x), avx2.PackedLinear(weight, bias, False)(x))


def _logits_on(module, monkeypatch, target_of):
    """(target, the logits of a fixed prompt's pass) with `module` as the kernels; target_of() loads the target."""
    monkeypatch.setattr(kernels, "load", lambda isa=None: module)
    target = target_of()
    ids = torch.randint(0, 60, (37,), generator=torch.Generator().manual_seed(1))
    backend = target.backend
    logits = backend.forward(backend.new_cache(), ids).logits
    return target, logits


def test_a_model_and_its_drafting_copy_give_the_avx2_builds_logits(emulated, avx2, monkeypatch):
    from specdec.config import GenerationConfig
    from specdec.speculation_config import SpeculationConfig
    from specdec.drafters import create_drafter
    from specdec.engine import SpecDecoder

    def target_of():
        return loaded(tiny_llama(seed=0, vocab=96, hidden=64, heads=4, kv_heads=2, layers=3), "kernels")

    prompt = torch.randint(0, 90, (29,), generator=torch.Generator().manual_seed(3)).tolist()
    results = []
    for module in (avx2, emulated):
        target, logits = _logits_on(module, monkeypatch, target_of)
        copy = target.backend.four_bit_copy()
        assert type(copy).__module__ == module.__name__  # the copy is the module's own
        config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
        plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
        drafter = create_drafter("quantized", target)
        spec, metrics = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False)
                                    ).generate_ids(prompt, config)
        assert spec == plain and metrics.drafted_tokens > 0
        results.append((logits, plain, metrics.accepted_tokens, metrics.drafted_tokens))
    (want, want_plain, *want_counts), (got, got_plain, *got_counts) = results
    assert torch.equal(got, want)
    assert got_plain == want_plain and got_counts == want_counts  # the copy drafted the same tokens


def test_a_quantized_gguf_models_logits_are_the_avx2_builds(emulated, avx2, monkeypatch, tmp_path):
    from families import bpe_tokenizer
    from gguf_writer import write_gguf
    from specdec.models.loading import load_model
    from test_gguf_quantized_model import _model

    # every format, q, k and v each in its own (one fused product of parts); K-quants need inner sizes of 256
    mix = {"attn_q": "Q4_0", "attn_k": "Q5_K", "attn_v": "Q6_K", "ffn_down": "Q4_K", "token_embd": "Q8_0", "": "Q4_1"}
    path = write_gguf(_model("llama", hidden_size=256, intermediate_size=512), bpe_tokenizer(),
                      tmp_path / "mixed.gguf", quant=mix)
    (want_target, want), (target, got) = [_logits_on(module, monkeypatch, lambda: load_model(str(path), device="cpu"))
                                          for module in (avx2, emulated)]
    assert target.backend.weight_types == want_target.backend.weight_types == ["Q4_0", "Q4_1", "Q4_K", "Q5_K",
                                                                                "Q6_K", "Q8_0"]
    assert torch.equal(got, want)
