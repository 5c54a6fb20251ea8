"""The kernels' KV cache in bfloat16 (kernels-bf16kv; float32 by default): every key and value is the float32 one
rounded to nearest even as it is written (the same as torch rounds), read back as written, moved whole by tree
compaction, and speculation still gives plain decoding's tokens."""
import pytest
import torch

from specdec.errors import ConfigError
from tiny import loaded, tiny_llama

BLOCK = 16  # keys sit in blocks of 16 positions


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=11, vocab=96, hidden=64, heads=4, kv_heads=2, layers=2, init_range=0.1).to(torch.bfloat16)


def _backend(model, kv_dtype):
    return loaded(model, "kernels-bf16kv" if kv_dtype == torch.bfloat16 else "kernels", dtype=torch.bfloat16).backend


def _written(backend, cache, n):
    """The first n positions' keys ((L, nkv, n/16, hd, 16): blocks of 16) and values ((L, nkv, n, hd)) of a slot."""
    keys, values = backend.pool.keys[:, cache.slot], backend.pool.values[:, cache.slot]
    L, nkv, P, hd = keys.shape
    blocks = keys.reshape(L, nkv, P // BLOCK, hd, BLOCK)[:, :, : n // BLOCK]
    return blocks, values[:, :, :n]


def test_a_bfloat16_models_cache_is_bfloat16_rounded_as_torch_rounds(model):
    ids = torch.arange(1, 49)  # three whole blocks of keys
    backends = {dtype: _backend(model, dtype) for dtype in (torch.bfloat16, torch.float32)}
    assert {dtype: backend.pool.keys.dtype for dtype, backend in backends.items()} == {dtype: dtype for dtype in backends}
    caches = {dtype: backend.new_cache() for dtype, backend in backends.items()}
    logits = {dtype: backends[dtype].forward(caches[dtype], ids).logits for dtype in backends}
    # the first layer's keys and values come from the embeddings alone, the same float32 numbers in both
    rounded = [t[0].to(torch.bfloat16) for t in _written(backends[torch.float32], caches[torch.float32], len(ids))]
    held = [t[0] for t in _written(backends[torch.bfloat16], caches[torch.bfloat16], len(ids))]
    assert torch.equal(held[0], rounded[0]) and torch.equal(held[1], rounded[1])
    # the first token sees only its own key, so its keys and values round the same way in both: its logits differ
    # by the rounding of its value alone; later tokens read the cache back (a misread layout would be far off)
    error = (logits[torch.bfloat16].float() - logits[torch.float32].float()).abs().max()
    assert 0 < error < 0.05 * logits[torch.float32].float().abs().max()


def test_compaction_moves_bfloat16_entries_whole(model):
    backend = _backend(model, torch.bfloat16)
    cache = backend.new_cache()
    backend.forward(cache, torch.arange(1, 65))
    before_keys, before_values = (t.clone() for t in _written(backend, cache, 64))
    keep = [0, 3, 17, 18, 40]
    backend.compact(cache, 10, keep)
    keys, values = _written(backend, cache, 64)
    flat = lambda k: k.permute(0, 1, 2, 4, 3).reshape(k.shape[0], k.shape[1], -1, k.shape[3])  # (L, nkv, n, hd)
    for i, j in enumerate(keep):
        assert torch.equal(flat(keys)[:, :, 10 + i], flat(before_keys)[:, :, 10 + j])
        assert torch.equal(values[:, :, 10 + i], before_values[:, :, 10 + j])
    assert cache.length == 10 + len(keep)


@pytest.mark.parametrize("drafter", ["ngram", "quantized"])
def test_speculation_on_a_bfloat16_cache_gives_plain_decodings_tokens(model, drafter):
    from specdec.config import GenerationConfig
    from specdec.speculation_config import SpeculationConfig
    from specdec.drafters import create_drafter
    from specdec.engine import SpecDecoder

    target = loaded(model, "kernels-bf16kv", dtype=torch.bfloat16)
    assert target.backend.pool.keys.dtype == torch.bfloat16
    prompt = [5, 9, 14, 5, 9, 14, 5, 9, 30, 31, 32, 5, 9]
    config = GenerationConfig(max_new_tokens=40)
    plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
    made = create_drafter(drafter, target)
    fast = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    tokens, metrics = fast.generate_ids(prompt, config)
    assert tokens == plain
    assert metrics.drafted_tokens > 0


def test_a_bfloat16_cache_needs_bfloat16_weights():
    with pytest.raises(ConfigError, match="bfloat16 KV cache"):
        loaded(tiny_llama(seed=1, hidden=64, heads=4), "kernels-bf16kv")
