"""bfloat16 products on AMX tiles (CPUs with AMX-BF16): batch-invariant, close to the AVX-512 products they replace.

The kernels choose AMX by machine and inner size only, so every pass of a model multiplies the same way; these tests
compare the two with `set_amx`, which only tests may call.
"""
import pytest
import torch

from specdec.kernels import KernelUnavailable, load

from tiny import loaded, tiny_llama


def _kernels_with_amx():
    try:
        module = load()
    except KernelUnavailable as exc:
        pytest.skip(str(exc))
    if not module.amx_available():
        pytest.skip("the CPU or OS does not allow AMX tiles")
    return module


@pytest.fixture
def kernels():
    module = _kernels_with_amx()
    yield module
    module.set_amx(True)


@pytest.mark.parametrize("out_features,in_features", [(200, 96), (64, 576), (70, 1536)])
def test_amx_rows_do_not_depend_on_the_rows_beside_them(kernels, out_features, in_features):
    """Each row of a 37-row product (three tiles of 16 rows, the last partly zeros) equals that row multiplied alone,
    bit for bit; columns past a 64-column block's end are not written."""
    torch.manual_seed(0)
    linear = kernels.PackedLinear(torch.randn(out_features, in_features).bfloat16(), torch.randn(out_features), True)
    x = torch.randn(37, in_features)
    together = linear(x)
    assert together.shape == (37, out_features)
    for r in (0, 15, 16, 31, 36):
        assert torch.equal(linear(x[r:r + 1])[0], together[r])
    assert torch.equal(linear(x[10:20]), together[10:20])


def test_amx_products_equal_the_avx512_ones_up_to_rounding(kernels):
    """Both round x to bfloat16 and sum exact products in float32; only the order of rounding in the sums differs."""
    torch.manual_seed(1)
    weight, bias = torch.randn(130, 576).bfloat16(), torch.randn(130)
    x = torch.randn(20, 576)
    linear = kernels.PackedLinear(weight, bias, True)
    kernels.set_amx(False)
    avx = linear(x)
    kernels.set_amx(True)
    amx = linear(x)
    reference = (x.bfloat16().double() @ weight.double().T + bias.double()).float()
    assert not torch.equal(amx, avx)  # really another path
    scale = float(reference.abs().max())
    assert float((amx - reference).abs().max()) < 1e-5 * scale
    assert float((avx - reference).abs().max()) < 1e-5 * scale


def test_inner_sizes_not_a_multiple_of_32_keep_the_avx512_products(kernels):
    torch.manual_seed(2)
    linear = kernels.PackedLinear(torch.randn(64, 48).bfloat16(), torch.empty(0), True)
    x = torch.randn(5, 48)
    amx = linear(x)
    kernels.set_amx(False)
    assert torch.equal(linear(x), amx)


def test_a_model_on_amx_keeps_its_logits_and_greedy_tokens(kernels):
    """kernels-bf16 on AMX tiles against the same weights on AVX-512 products: logits within bfloat16 rounding of
    one another, the same argmax, and (batch invariance) one pass over 12 tokens equals 12 one-token passes."""
    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2).to(torch.bfloat16)
    backend = loaded(model, "kernels-bf16", dtype=torch.bfloat16).backend
    prompt, steps = torch.arange(3, 40), torch.tensor([7, 1, 9, 4, 4, 2, 8, 5, 3, 3, 6, 1])

    def logits(amx: bool) -> tuple[torch.Tensor, torch.Tensor]:
        kernels.set_amx(amx)
        cache = backend.new_cache()
        backend.forward(cache, prompt)
        wide = backend.forward(cache, steps).logits
        backend.truncate(cache, len(prompt))
        narrow = torch.cat([backend.forward(cache, steps[i:i + 1]).logits for i in range(len(steps))])
        return wide, narrow

    (amx_wide, amx_narrow), (avx_wide, _) = logits(True), logits(False)
    assert torch.equal(amx_wide, amx_narrow)
    assert not torch.equal(amx_wide, avx_wide)
    torch.testing.assert_close(amx_wide, avx_wide, rtol=0.02, atol=0.02 * float(avx_wide.std()))
    assert torch.equal(amx_wide.argmax(-1), avx_wide.argmax(-1))
