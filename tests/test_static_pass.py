"""The shape-static pass (models/static_pass.py) and its buckets (models/pass_graphs.py), uncaptured on the CPU: the
logic that CUDA graphs capture on a GPU (tests/test_cuda_graphs.py replays it there)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec.errors import ConfigError
from specdec.models.llama import FastLlama
from specdec.models.backend_choice import make_backend
from specdec.models.loading import model_info
from specdec.models.pass_graphs import (BATCH_SIZES, TOKEN_COUNTS, PassGraphs, key_windows, padded_inputs,
                                        smallest_fitting)
from specdec.models.static_pass import static_pass
from specdec.verify import tree_mask
from tiny import _NoTokenizer, tiny_llama

# Where the shapes are the eager pass's own (no padding, the window cut to the row's own keys), the static pass is
# bit-identical to it (test below). Padded to a bucket, or reading the whole pool's window, its float32 logits differ
# from the eager pass's by rounding alone, up to about 1e-5 on logits of magnitude ~7 here: the CPU's matrix products
# round a row differently with the number of rows in the product (the kernel is chosen by shape), and a longer
# attention reduction over masked keys (exact zeros) is blocked differently. Greedy outputs are compared exactly.
CLOSE = {"rtol": 1e-5, "atol": 2e-5}
PARENTS = [-1, -1, 0, 2, 1, 0]  # a tree of 6 nodes under the root


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


def _pair(model, slots: int = 4):
    """(eager FastLlama, FastLlama with static passes uncaptured) of the same weights."""
    info = model_info("tiny", model, _NoTokenizer(model), torch.device("cpu"), torch.float32)
    return FastLlama(model, info, slots=slots), FastLlama(model, info, slots=slots, graphs="eager")


def _ids(n: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 63, (n,), generator=torch.Generator().manual_seed(seed))


def _prefilled(backend, lengths: list[int], scattered: bool = False):
    """Caches holding random prompts of these lengths; scattered: in every other slot (rows of a batch whose slots
    are not contiguous)."""
    caches = [backend.new_cache() for _ in range(len(lengths) * (2 if scattered else 1))]
    caches = caches[1::2] if scattered else caches
    for i, (cache, n) in enumerate(zip(caches, lengths)):
        backend.forward(cache, _ids(n, 100 + i), last_only=True)
    return caches


@pytest.mark.parametrize("tokens", [1, 3, 8, "tree"])
def test_static_pass_over_the_rows_own_keys_is_bit_identical_to_the_eager_pass(model, tokens):
    """Masks, KV writes and RoPE positions are exact: in the eager pass's own shape (no padding) and cut to the keys
    it reads, the static pass gives its very logits; padded to buckets, the same up to rounding."""
    eager, static = _pair(model)
    mask = tree_mask(PARENTS) if tokens == "tree" else None
    n = len(PARENTS) + 1 if tokens == "tree" else tokens
    ids = _ids(n, 1)
    (cache,) = _prefilled(static, [13])
    want = static._forward([cache], ids.view(1, -1), [n], mask, False, False)[0][0]
    static.truncate(cache, 13)
    for shape in [(1, n), (1, smallest_fitting(TOKEN_COUNTS, n)), (BATCH_SIZES[-1], TOKEN_COUNTS[-1])]:
        inputs = padded_inputs(shape, [cache], [ids], mask, static.pool.capacity - 1)
        logits, _ = static_pass(static, inputs, 13 + n)
        if shape == (1, n):
            assert torch.equal(logits[0], want)
        torch.testing.assert_close(logits[0, :n], want, **CLOSE)
        assert torch.equal(logits[0, :n].argmax(-1), want.argmax(-1))


@pytest.mark.parametrize("tokens", [1, 5, "tree"])
def test_graph_path_logits_equal_the_eager_forward(model, tokens):
    eager, static = _pair(model)
    mask = tree_mask(PARENTS) if tokens == "tree" else None
    n = len(PARENTS) + 1 if tokens == "tree" else tokens
    (ce,), (cs,) = _prefilled(eager, [21]), _prefilled(static, [21])
    for step in range(3):  # a few steps, each rolled back to one accepted token as verification would
        ids = _ids(n, step)
        want = eager.forward(ce, ids, tree_mask=mask, output_hidden=True)
        got = static.forward(cs, ids, tree_mask=mask, output_hidden=True)
        torch.testing.assert_close(got.logits, want.logits, **CLOSE)
        torch.testing.assert_close(got.hidden, want.hidden, **CLOSE)
        assert torch.equal(got.logits.argmax(-1), want.logits.argmax(-1))
        assert ce.length == cs.length == 21 + step + n
        eager.truncate(ce, 22 + step)
        static.truncate(cs, 22 + step)


def test_a_batch_of_rows_at_different_lengths_in_scattered_slots(model):
    eager, static = _pair(model, slots=8)
    lengths = [5, 30, 17]
    ce, cs = _prefilled(eager, lengths, True), _prefilled(static, lengths, True)
    for step, counts in enumerate([[1, 1, 1], [3, 1, 6], [2, 7, 4]]):
        ids = [_ids(n, 10 * step + i) for i, n in enumerate(counts)]
        want, got = eager.forward_batch(ce, ids), static.forward_batch(cs, ids)
        for w, g in zip(want, got):
            torch.testing.assert_close(g.logits, w.logits, **CLOSE)
            assert torch.equal(g.logits.argmax(-1), w.logits.argmax(-1))
        assert [c.length for c in cs] == [c.length for c in ce]


def test_padding_never_changes_live_cache_rows_nor_live_outputs(model):
    """A padded pass writes each live token's own row and the scratch rows only; what padding tokens hold never
    changes a live token's logits."""
    _, static = _pair(model, slots=6)
    caches = _prefilled(static, [9, 25, 4], scattered=True)
    counts = [2, 3, 1]
    ids = [_ids(n, i) for i, n in enumerate(counts)]
    scratch = static.pool.capacity - 1
    inputs = padded_inputs((4, 4), caches, ids, None, scratch)
    before = static.pool.keys.clone(), static.pool.values.clone()
    logits, _ = static_pass(static, inputs, static.pool.capacity)
    written = torch.zeros(static.pool.slots, static.pool.capacity, dtype=torch.bool)
    for cache, n in zip(caches, counts):
        written[cache.slot, cache.length:cache.length + n] = True
    written[:, scratch] = True
    for old, new in zip(before, (static.pool.keys, static.pool.values)):  # (layers, slots, kv_heads, rows, hd)
        changed = (old != new).any(-1).any(2).any(0)  # (slots, rows)
        assert not (changed & ~written).any()
    other = padded_inputs((4, 4), caches, ids, None, scratch)
    padding = other.write_rows == scratch
    other.ids[padding] = _ids(int(padding.sum()), 7)
    other.positions[padding] = _ids(int(padding.sum()), 8)
    again, _ = static_pass(static, other, static.pool.capacity)
    for b, n in enumerate(counts):
        assert torch.equal(again[b, :n], logits[b, :n])


def test_key_windows_grow_with_the_context_up_to_the_whole_pool(model):
    """Passes whose keys fit a window read that window; the last reaches the pool's end, where the scratch row lies
    inside the window (and stays hidden). Each step compares both passes over the same cached keys."""
    info = model_info("tiny", model, _NoTokenizer(model), torch.device("cpu"), torch.float32)
    static = FastLlama(model, info, max_context=70, graphs="eager")
    static.pass_graphs = PassGraphs(static, capture=False, min_window=16)
    assert static.pass_graphs.windows == key_windows(71, 16) == (16, 32, 64, 71)
    (cache,) = _prefilled(static, [5])
    windows = set()
    while cache.length + 3 <= 70:
        start, ids = cache.length, _ids(3, cache.length)
        windows.add(smallest_fitting(static.pass_graphs.windows, start + 3))
        want = static._forward([cache], ids.view(1, -1), [3], None, False, False)[0][0]  # the eager pass
        static.truncate(cache, start)
        got = static.forward(cache, ids).logits
        # a window longer than the context sums its products in another order: float32 noise, a few units in the
        # last place of the largest logit (2.4e-5 against logits up to 8.7 on one thread of an AVX-512 CPU)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        assert torch.equal(got.argmax(-1), want.argmax(-1))
        static.truncate(cache, start + 2)
    assert windows == {16, 32, 64, 71}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 200), min_size=1, max_size=8, unique=True).map(sorted), st.integers(0, 220))
def test_the_bucket_is_the_smallest_that_fits(sizes, n):
    got = smallest_fitting(tuple(sizes), n)
    fitting = [s for s in sizes if s >= n]
    assert got == (min(fitting) if fitting else None)


@pytest.mark.parametrize("rows,tokens", [(1, TOKEN_COUNTS[-1] + 6), (BATCH_SIZES[-1] + 1, 2)])
def test_passes_larger_than_every_bucket_run_eagerly_with_the_same_output(model, rows, tokens):
    eager, static = _pair(model, slots=rows)
    assert static.pass_graphs.bucket_shape(rows, tokens) is None
    ce, cs = _prefilled(eager, [3 + i for i in range(rows)]), _prefilled(static, [3 + i for i in range(rows)])
    ids = [_ids(tokens, i) for i in range(rows)]
    for w, g in zip(eager.forward_batch(ce, ids), static.forward_batch(cs, ids)):
        assert torch.equal(g.logits, w.logits)  # the same eager forward ran


def test_graphs_on_needs_the_torch_backend(model):
    info = model_info("tiny", model, _NoTokenizer(model), torch.device("cpu"), torch.float32)
    with pytest.raises(ConfigError, match="torch backend"):
        make_backend(model, info, "hf", graphs="on")
    with pytest.raises(ConfigError, match="graphs must be one of"):
        make_backend(model, info, "torch", graphs="yes")
    assert make_backend(model, info, "torch", graphs="on").pass_graphs is not None
    assert make_backend(model, info, "torch").pass_graphs is None  # auto: captured on CUDA only
