"""KV caches: rollback, tree compaction and batched forwards give the same logits as fresh computation."""
import pytest
import torch

from specdec.kernels import bf16_prefill_wanted, has_bf16_products
from tiny import loaded, tiny_llama


BACKENDS = ["kernels", "torch", "hf"]


@pytest.fixture(scope="module")
def model():
    # head dim 16 and sizes that are multiples of 16, so that every backend (the CPU kernels too) runs it
    return tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)


def _fresh_logits(backend, tokens: list[int]) -> torch.Tensor:
    cache = backend.new_cache()
    out = backend.forward(cache, torch.tensor(tokens)).logits
    backend.release(cache)
    return out


@pytest.mark.parametrize("kind", BACKENDS)
def test_truncate_then_extend_matches_fresh(model, kind):
    backend = loaded(model, kind).backend
    cache = backend.new_cache()
    prompt, rejected, accepted = [5, 9, 2, 7, 1, 3], [11, 12, 13, 14], [20, 21, 22]
    backend.forward(cache, torch.tensor(prompt))
    backend.forward(cache, torch.tensor(rejected))
    assert cache.length == 10
    backend.truncate(cache, len(prompt) + 1)  # keep the first rejected token only
    assert cache.length == 7
    got = backend.forward(cache, torch.tensor(accepted)).logits
    want = _fresh_logits(backend, prompt + rejected[:1] + accepted)[-3:]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", BACKENDS)
def test_tree_forward_and_compaction(model, kind):
    """A tree root -> (x, y), x -> z: scoring it once equals scoring each path; keeping path root-y works."""
    backend = loaded(model, kind).backend
    prompt = [4, 8, 15, 16, 23]
    root, x, y, z = 42, 3, 9, 30
    tree = torch.tensor([[1, 0, 0, 0],   # root
                         [1, 1, 0, 0],   # x under root
                         [1, 0, 1, 0],   # y under root
                         [1, 1, 0, 1]],  # z under x
                        dtype=torch.bool)
    cache = backend.new_cache()
    backend.forward(cache, torch.tensor(prompt))
    got = backend.forward(cache, torch.tensor([root, x, y, z]), tree_mask=tree).logits
    torch.testing.assert_close(got[[0, 1, 3]], _fresh_logits(backend, prompt + [root, x, z])[-3:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], _fresh_logits(backend, prompt + [root, y])[-1], rtol=1e-5, atol=1e-5)
    backend.compact(cache, len(prompt), [0, 2])  # keep root, y
    assert cache.length == len(prompt) + 2
    nxt = backend.forward(cache, torch.tensor([7])).logits
    torch.testing.assert_close(nxt, _fresh_logits(backend, prompt + [root, y, 7])[-1:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["kernels", "torch"])
def test_batched_forward_matches_single(model, kind):
    """Ragged sequences in one pass score as they do alone (bit for bit on the kernels)."""
    from specdec.models.backend_choice import make_backend

    single = loaded(model, kind).backend
    batched = make_backend(model, single.info, kind, slots=3)

    def check(got, want):
        if kind == "kernels":
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)

    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11, 12]]
    caches = [batched.new_cache() for _ in prompts]
    outs = batched.forward_batch(caches, [torch.tensor(p) for p in prompts])
    for p, out in zip(prompts, outs):
        check(out.logits, _fresh_logits(single, p))
    steps = [[20, 21], [22], [23, 24, 25]]
    outs = batched.forward_batch(caches, [torch.tensor(s) for s in steps])
    for p, s, out in zip(prompts, steps, outs):
        check(out.logits, _fresh_logits(single, p + s)[-len(s):])
    for c, p, s in zip(caches, prompts, steps):  # a prefill scores only each sequence's last token
        batched.truncate(c, len(p))
    lasts = batched.forward_batch(caches, [torch.tensor(s) for s in steps], last_only=True)
    for p, s, out in zip(prompts, steps, lasts):
        check(out.logits, _fresh_logits(single, p + s)[-1:])
    batched.release(caches[1])
    assert batched.new_cache().slot == caches[1].slot


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_backend_is_bit_identical_to_transformers(dtype):
    """Prefill, one-token steps and verify-sized steps, after rollback too."""
    model = tiny_llama(seed=3, hidden=64, heads=8, kv_heads=2).to(dtype)
    fast, hf = loaded(model, "torch", dtype=dtype).backend, loaded(model, "hf", dtype=dtype).backend
    cf, ch = fast.new_cache(), hf.new_cache()
    for i, chunk in enumerate(([3, 1, 4, 1, 5, 9, 2, 6] * 8, [5], [3, 5, 8], [7], [9, 9, 9, 9, 1])):
        if i == 3:
            fast.truncate(cf, cf.length - 2)
            hf.truncate(ch, ch.length - 2)
        a = fast.forward(cf, torch.tensor(chunk), output_hidden=True)
        b = hf.forward(ch, torch.tensor(chunk), output_hidden=True)
        assert torch.equal(a.logits, b.logits)
        assert torch.equal(a.hidden, b.hidden)


needs_bf16_products = pytest.mark.skipif(not has_bf16_products(), reason="the CPU lacks AVX-512 BF16")
KERNEL_VARIANTS = [("kernels", torch.float32), ("kernels", torch.bfloat16), ("kernels", torch.float16),
                   ("kernels-fp32", torch.bfloat16), pytest.param("kernels-bf16", torch.bfloat16, marks=needs_bf16_products)]


@pytest.mark.parametrize("kind,dtype", KERNEL_VARIANTS)
@pytest.mark.parametrize(
    "shape", [(64, 4, 2), (128, 2, 1), (192, 6, 2)], ids=["head_dim16", "head_dim64", "head_dim32_groups3"]
)
def test_kernels_are_batch_invariant_bit_for_bit(kind, dtype, shape):
    """One pass over k tokens, k one-token passes, a tree and a batch of sequences give identical logits
    (attention rows that share their keys' values are summed side by side, each in its own order: a one-token
    pass sums its head group's 2 or 3 rows together, a wide pass 8 at a time)."""
    hidden, heads, kv_heads = shape
    model = tiny_llama(seed=5, hidden=hidden, heads=heads, kv_heads=kv_heads).to(dtype)
    backend = loaded(model, kind, dtype=dtype).backend
    # 24 steps: enough attention rows that the wide pass sums them in groups of 8 (the narrow ones, one by one)
    prompt, steps = torch.arange(3, 40), torch.tensor([7, 1, 9, 4, 4, 2, 8, 5] * 3)
    cache = backend.new_cache()
    backend.forward(cache, prompt)
    wide = backend.forward(cache, steps).logits
    backend.truncate(cache, len(prompt))
    narrow = torch.cat([backend.forward(cache, steps[i:i + 1]).logits for i in range(len(steps))])
    assert torch.equal(wide, narrow)
    # a tree whose first path is steps[0], steps[1] and whose second branch is steps[2] under steps[0]
    backend.truncate(cache, len(prompt))
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    scored = backend.forward(cache, steps[:3], tree_mask=tree).logits
    assert torch.equal(scored[:2], wide[:2])
    backend.compact(cache, len(prompt), [0, 2])
    path = backend.new_cache()  # the kept path scored afresh after the same prompt pass (a sequence's first pass
    backend.forward(path, prompt)  # may multiply differently from its later ones)
    assert torch.equal(backend.forward(cache, steps[3:4]).logits[0],
                       backend.forward(path, torch.tensor([7, 9, 4])).logits[-1])
    # the same sequence inside a batch of three ragged ones
    others = [backend.new_cache() for _ in range(2)]
    backend.truncate(cache, len(prompt))
    outs = backend.forward_batch([others[0], cache, others[1]], [torch.arange(5), steps, torch.arange(9, 21)])
    assert torch.equal(outs[1].logits, wide)


def test_kernels_match_transformers_in_float32(model):
    kern, hf = loaded(model, "kernels").backend, loaded(model, "hf").backend
    ck, ch = kern.new_cache(), hf.new_cache()
    for chunk in ([3, 1, 4, 1, 5, 9, 2, 6] * 4, [5], [3, 5, 8]):
        torch.testing.assert_close(kern.forward(ck, torch.tensor(chunk)).logits,
                                   hf.forward(ch, torch.tensor(chunk)).logits, rtol=1e-4, atol=1e-4)


@needs_bf16_products
def test_bf16_products_stay_close_to_float32_products():
    """kernels-bf16 only rounds each product's input to bfloat16: logits stay near the float32-activation ones."""
    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2).to(torch.bfloat16)
    exact, fast = (loaded(model, kind, dtype=torch.bfloat16).backend for kind in ("kernels-fp32", "kernels-bf16"))
    ids = torch.arange(3, 60)
    a, b = exact.forward(exact.new_cache(), ids).logits, fast.forward(fast.new_cache(), ids).logits
    assert not torch.equal(a, b)  # the products really are computed differently
    error = (b - a).abs()
    assert error.mean() < 0.02 * a.std() and error.max() < 0.2 * a.std()  # bfloat16 carries ~3 digits
    assert torch.equal(a.argmax(-1), b.argmax(-1))


@needs_bf16_products
def test_kernels_prefill_prompts_with_bf16_products():
    """With bfloat16 weights, `kernels` multiplies in bfloat16 in a sequence's first pass (as kernels-bf16 does) and in
    float32 afterwards (as kernels-fp32 does); a pass that mixes first and later passes scores each as it would alone.
    SPECDEC_BF16_PREFILL=off makes the first pass kernels-fp32's too."""
    model = tiny_llama(seed=5, hidden=64, heads=4, kv_heads=2).to(torch.bfloat16)
    default, fp32, bf16 = (loaded(model, kind, dtype=torch.bfloat16).backend
                           for kind in ("kernels", "kernels-fp32", "kernels-bf16"))
    assert default.bf16_prefill == bf16_prefill_wanted()
    prompt, steps = torch.arange(3, 60), torch.tensor([7, 1, 9, 4])
    first = [b.forward(b.new_cache(), prompt).logits for b in (default, fp32, bf16)]
    like, unlike = (2, 1) if default.bf16_prefill else (1, 2)  # kernels-bf16's prefill, or kernels-fp32's
    assert torch.equal(first[0], first[like]) and not torch.equal(first[0], first[unlike])
    # later passes: float32 products over the prefilled cache (so unlike kernels-bf16's)
    caches = [b.new_cache() for b in (default, bf16)]
    later = []
    for b, c in zip((default, bf16), caches):
        b.forward(c, prompt)
        later.append(b.forward(c, steps).logits)
    assert not torch.equal(later[0], later[1])
    torch.testing.assert_close(later[0], later[1], rtol=0.05, atol=0.05 * float(later[1].std()))
    # one ragged pass holding a continuing sequence and a new one
    going, new = default.new_cache(), default.new_cache()
    default.forward(going, prompt)
    outs = default.forward_batch([going, new], [steps, prompt])
    assert torch.equal(outs[0].logits, later[0]) and torch.equal(outs[1].logits, first[0])
    assert going.length == len(prompt) + len(steps) and new.length == len(prompt)


def test_ragged_rows_that_fit_alone_fit_in_one_batched_call():
    """Padded to the longest row, a late-starting row and a long fresh one would run past the cache's end (the
    soak's 5xx: "sequence of 521 tokens exceeds the cache's 512"); each fits alone, so the batch runs in groups
    and scores each row as it scores alone."""
    from specdec.models.backend_choice import make_backend
    from specdec.models.loading import model_info as info_of

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    info = info_of("tiny", model, None, torch.device("cpu"), torch.float32)
    backend = make_backend(model, info, "torch", slots=3, max_context=64)
    late, fresh, other = backend.new_cache(), backend.new_cache(), backend.new_cache()
    gen = torch.Generator().manual_seed(0)
    backend.forward(late, torch.randint(0, 60, (50,), generator=gen))
    backend.forward(other, torch.randint(0, 60, (10,), generator=gen))
    inputs = [torch.randint(0, 60, (n,), generator=gen) for n in (4, 40, 3)]
    outs = backend.forward_batch([late, fresh, other], inputs)
    assert [c.length for c in (late, fresh, other)] == [54, 40, 13]
    for cache, ids, out in zip((late, fresh, other), inputs, outs):
        alone = backend.new_cache()
        backend.copy_cache(cache, alone, cache.length - len(ids))
        torch.testing.assert_close(out.logits, backend.forward(alone, ids).logits, atol=1e-5, rtol=1e-5)
        backend.release(alone)


@pytest.mark.parametrize("lengths", [[780, 100, 9, 100], [9] * 8, [1, 9, 5, 9, 2], [60, 90, 400, 780, 61], [5]])
def test_padding_groups_keep_each_row_once_and_bound_the_padding(lengths):
    from specdec.models.ops import PAD_WASTE_TOKENS, padding_groups

    groups = padding_groups(lengths)
    assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
    for group in groups:  # each row that joined a group padded the rows before it by at most the allowance
        ordered = sorted(lengths[i] for i in group)
        assert all(j * (ordered[j] - ordered[j - 1]) <= PAD_WASTE_TOKENS for j in range(1, len(ordered)))
    for earlier, later in zip(groups, groups[1:]):  # a group is split off only where joining would pad too much
        assert len(earlier) * (min(lengths[i] for i in later) - max(lengths[i] for i in earlier)) > PAD_WASTE_TOKENS


def test_prompts_of_unequal_lengths_are_prefilled_in_passes_apart_and_scored_as_alone():
    """A batched prefill of a short and a long prompt would compute the short one at the long one's length (3x the
    time on a CPU); the torch backend runs them in two passes, each scored as alone; equal verify rows stay one."""
    from specdec.models.backend_choice import make_backend
    from specdec.models.loading import model_info as info_of

    model = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2)
    info = info_of("tiny", model, None, torch.device("cpu"), torch.float32)
    backend = make_backend(model, info, "torch", slots=4, max_context=256)
    passes = []
    forward = backend._forward
    backend._forward = lambda caches, ids, *a, **kw: passes.append(tuple(ids.shape)) or forward(caches, ids, *a, **kw)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 60, (n,), generator=gen) for n in (12, 150, 13)]
    caches = [backend.new_cache() for _ in prompts]
    outs = backend.forward_batch(caches, prompts)
    assert sorted(passes) == [(1, 150), (2, 13)]
    for ids, out in zip(prompts, outs):
        alone = backend.new_cache()
        torch.testing.assert_close(out.logits, backend.forward(alone, ids).logits, atol=1e-5, rtol=1e-5)
        backend.release(alone)
    passes.clear()
    backend.forward_batch(caches, [torch.randint(0, 60, (5,), generator=gen) for _ in caches])
    assert passes == [(3, 5)]


def test_rows_in_scattered_slots_attend_over_their_own_cache_as_alone():
    """Rows whose slots are not contiguous attend one by one over their own slot's cache, read in place (gathering
    the slots copied every row's cache up to the longest row's end in each layer, half the soak's decode time); each
    row's logits are those of its pass alone (to rounding: the matrix products see another batch size), for one
    token and for a chain of drafts."""
    from specdec.models.backend_choice import make_backend
    from specdec.models.loading import model_info as info_of

    model = tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2)
    info = info_of("tiny", model, None, torch.device("cpu"), torch.float32)
    backend = make_backend(model, info, "torch", slots=6, max_context=128)
    gen = torch.Generator().manual_seed(2)
    caches = [backend.new_cache() for _ in range(6)]
    for cache, n in zip(caches, (7, 40, 3, 90, 12, 25)):
        backend.forward(cache, torch.randint(0, 60, (n,), generator=gen))
    rows = [caches[4], caches[1], caches[3]]  # scattered, out of order
    for T in (1, 4):
        inputs = [torch.randint(0, 60, (T,), generator=gen) for _ in rows]
        outs = backend.forward_batch(rows, inputs)
        for cache, ids, out in zip(rows, inputs, outs):
            alone = backend.new_cache()
            backend.copy_cache(cache, alone, cache.length - T)
            torch.testing.assert_close(out.logits, backend.forward(alone, ids).logits, atol=1e-5, rtol=1e-5)
            backend.release(alone)
