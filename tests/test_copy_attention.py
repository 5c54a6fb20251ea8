"""The quantized copy's attention by pieces of keys (kernels/attention_split.h): the same attention as the target's
order up to float rounding, at every context length around the pieces' edges, and independent of the batch."""
import pytest
import torch

from specdec.models.kernel_args import kernel_model_args
from tiny import loaded, tiny_llama

PIECE = 128  # kPieceKeys


def _builds():
    from specdec import kernels

    reason = kernels.unavailable_reason()
    if reason:
        pytest.skip(f"the CPU kernels cannot run here: {reason}")
    return [kernels.load()] + ([kernels.load("avx2")] if kernels.instruction_set() == "avx512" else [])


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(seed=3, vocab=96, hidden=96, heads=6, kv_heads=2, layers=1, init_range=0.1)
    return model, loaded(model, "kernels", slots=2).backend


def _copy_pass(copy, backend, caches, feeds, starts):
    """The copy's logits (rows, V) and final hidden states (rows, H) for each cache's feed from its start."""
    lengths = [len(f) for f in feeds]
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)])
    logits, hidden, _ = copy.forward(
        torch.tensor([t for f in feeds for t in f]), torch.tensor([0] + lengths).cumsum(0),
        torch.tensor([c.slot for c in caches]), torch.tensor(starts), positions, torch.empty(0, dtype=torch.uint8),
        backend.pool.keys, backend.pool.values, torch.arange(sum(lengths)), 0, False, torch.empty(0, dtype=torch.long),
        False)
    return logits, hidden


def _with_split(module, on, run):
    was = module.set_split_attention(on)
    try:
        return run()
    finally:
        module.set_split_attention(was)


@pytest.mark.parametrize("context", [1, 15, 16, 17, PIECE - 1, PIECE, PIECE + 1, 2 * PIECE + 5, 3 * PIECE + 40])
@pytest.mark.parametrize("tokens", [1, 2])
def test_attention_by_pieces_agrees_with_the_targets_order(target, context, tokens):
    """Passes of one and two tokens a sequence (the ones that split keys for smollm2's three heads per KV head)
    give the copy's hidden states of attention.h's order up to rounding. The copy rounds activations to int8, which
    turns a last-bit difference into at most a step of that rounding, far below what a wrong piece would do."""
    model, backend = target
    cache = backend.new_cache()
    try:
        backend.forward(cache, torch.randint(1, 95, (context,), generator=torch.Generator().manual_seed(context)))
        feed = [[(7 * context + i) % 95 + 1 for i in range(tokens)]]
        for module in _builds():
            copy = module.CpuLlama(*kernel_model_args(model, backend.max_context), False, True, False)
            run = lambda: _copy_pass(copy, backend, [cache], feed, [context])
            (split_logits, split_hidden), (rows_logits, rows_hidden) = (_with_split(module, on, run)
                                                                        for on in (True, False))
            scale = rows_hidden.abs().max()
            assert (split_hidden - rows_hidden).abs().max() <= 2e-2 * scale, (context, tokens)
            assert torch.equal(split_logits.argmax(-1), rows_logits.argmax(-1))
    finally:
        backend.release(cache)


def test_a_rows_attention_by_pieces_does_not_depend_on_the_batch(target):
    """Pieces sit at fixed positions: a sequence drafted alone and beside another gets the same logits bit for bit."""
    model, backend = target
    caches = [backend.new_cache(), backend.new_cache()]
    try:
        for cache, n in zip(caches, (3 * PIECE + 9, 40)):
            backend.forward(cache, torch.randint(1, 95, (n,), generator=torch.Generator().manual_seed(n)))
        starts = [c.length for c in caches]
        for module in _builds():
            copy = module.CpuLlama(*kernel_model_args(model, backend.max_context), False, True, False)
            alone, _ = _with_split(module, True,
                                   lambda: _copy_pass(copy, backend, caches[:1], [[5]], starts[:1]))
            both, _ = _with_split(module, True,
                                  lambda: _copy_pass(copy, backend, caches, [[5], [9, 4]], starts))
            assert torch.equal(alone, both[:1])
    finally:
        for cache in caches:
            backend.release(cache)
