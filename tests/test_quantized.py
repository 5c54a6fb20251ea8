"""Quantized self-speculation: the target's 4-bit copy drafts on the target's own KV cache; output stays the
target's."""
import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from tiny import loaded, tiny_llama


def _tiny():
    return tiny_llama(seed=5, vocab=96, hidden=64, heads=4, kv_heads=2, layers=3, init_range=0.1)


@pytest.fixture(scope="module")
def model():
    """A tiny model whose layers' weights are 4-bit groups already, as the default model's (from a Q4_1 GGUF) are."""
    return _snap_layers(_tiny())


def _snap_layers(model):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2 and "layers" in name:
                p.copy_(_snapped(p))
    return model


def _reference(x: torch.Tensor, w: torch.Tensor, bits: int) -> torch.Tensor:
    """What the quantized product computes, in float64: w in groups of 32 (Q4_1: d u + m, Q8_0: d q; float16 d and
    m) times x rounded to int8 per group of 32, plus m times the exact x (its group sums)."""
    g = w.double().view(w.shape[0], -1, 32)
    m = torch.zeros_like(g[..., :1])
    if bits == 4:
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        m, d = lo.half().double(), ((hi - lo) / 15).half().double()
        steps = torch.where(d > 0, ((g - m) / d.clamp_min(1e-30)).round().clamp(0, 15), 0) * d
    else:
        d = (g.abs().amax(-1, keepdim=True) / 127).half().double()
        steps = torch.where(d > 0, (g / d.clamp_min(1e-30)).round().clamp(-127, 127), 0) * d
    xg = x.double().view(x.shape[0], -1, 32)
    scale = xg.abs().amax(-1, keepdim=True) / 127
    xq = torch.where(scale > 0, (xg / scale.clamp_min(1e-300)).round(), 0) * scale
    return xq.view(x.shape) @ steps.view(w.shape).T + x.double() @ m.expand_as(g).reshape(w.shape).T


def _snapped(w: torch.Tensor) -> torch.Tensor:
    """w rounded to its own 4-bit groups (Q4_1, float16 d and m), as a Q4_1 GGUF's weights are."""
    g = w.double().view(w.shape[0], -1, 32)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    m, d = lo.half().double(), ((hi - lo) / 15).half().double()
    return (torch.where(d > 0, ((g - m) / d.clamp_min(1e-30)).round().clamp(0, 15), 0) * d + m).view(w.shape).float()


def _builds():
    from specdec import kernels

    reason = kernels.unavailable_reason()
    if reason:
        pytest.skip(f"the CPU kernels cannot run here: {reason}")
    return [kernels.load()] + ([kernels.load("avx2")] if kernels.instruction_set() == "avx512" else [])


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows,out_features,in_features", [(1, 64, 32), (3, 100, 96), (6, 130, 576)])
def test_quantized_products_equal_the_dequantized_reference_in_every_build(bits, rows, out_features, in_features):
    gen = torch.Generator().manual_seed(bits * 100 + rows)
    x = torch.randn(rows, in_features, generator=gen)
    w = torch.randn(out_features, in_features, generator=gen) * 0.05
    w[:, :32] = 0.25  # a group with d = 0
    x[0, :32] = torch.tensor([4.0, -4.0] * 16)  # a group rounded to +-127: the largest integer products
    want = _reference(x, w, bits)
    builds = _builds()
    for module in builds:
        got = module.quantized_matmul(x, w, bits).double()
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
    # every build sums the same integers in the same order (VNNI's dot products where the CPU has them, 16-bit pair
    # sums that never saturate elsewhere), so their floats agree to the bit
    first = builds[0].quantized_matmul(x, w, bits)
    for module in builds[1:]:
        assert torch.equal(module.quantized_matmul(x, w, bits), first)


def test_a_copy_of_weights_already_in_4_bit_groups_reproduces_them(model):
    """Weights that are 4-bit groups already (as a Q4_1 GGUF's are) are the copy's own: its logits then differ from
    the target's by the rounding of activations (and the 8-bit LM head) alone, far less than for other weights."""
    errors = []
    for weights in (_tiny(), model):
        backend = loaded(weights, "kernels").backend
        cache = backend.new_cache()
        ids = torch.arange(1, 40)
        want = backend.forward(cache, ids).logits
        backend.truncate(cache, 0)
        got = backend.four_bit_copy().forward(
            ids, torch.tensor([0, len(ids)]), torch.tensor([cache.slot]), torch.tensor([0]), torch.arange(len(ids)),
            torch.empty(0, dtype=torch.uint8), backend.pool.keys, backend.pool.values, torch.arange(len(ids)), 0, False,
            torch.empty(0, dtype=torch.long), False)[0]
        errors.append(((got - want).abs().mean() / want.abs().mean()).item())
    assert errors[1] < 0.5 * errors[0], errors
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("adaptive", [False, True])
def test_the_quantized_copy_keeps_greedy_output(model, adaptive):
    target = loaded(model, "kernels")
    drafter = create_drafter("quantized", target)
    assert drafter.name == "quantized" and drafter.fork().name == "quantized"
    spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=5, adaptive=adaptive))
    base = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    accepted = drafted = 0
    for prompt in ([1, 2, 3], list(range(5, 60)), [9] * 12):
        got, metrics = spec.generate_ids(prompt, config)
        assert got == base.generate_ids(prompt, config)[0]
        accepted, drafted = accepted + metrics.accepted_tokens, drafted + metrics.drafted_tokens
    assert drafted > 0 and accepted / drafted > 0.5  # a copy guesses its model most of the time


def test_the_quantized_copy_in_a_batch_and_with_sampling(model):
    """Several requests at once, each drafting on its own cache slot, and seed-stable sampling (coupled): the text
    is plain decoding's."""
    target = loaded(model, "kernels", slots=4)
    speculation = SpeculationConfig(num_speculative_tokens=4, adaptive=False, sampling_verifier="coupled")
    spec = SpecDecoder(target, create_drafter("quantized", target), speculation)
    base = SpecDecoder(target, None, SpeculationConfig(sampling_verifier="coupled"))
    prompts = [[1, 2, 3], list(range(10, 40)), [7] * 9]
    greedy = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    want = [base.generate_ids(p, greedy)[0] for p in prompts]
    assert [r.token_ids for r in spec.generate_many(prompts, greedy)] == want
    sampled = GenerationConfig(max_new_tokens=30, ignore_eos=True, sampling=SamplingConfig(temperature=0.8, seed=11))
    for p in prompts:
        got, metrics = spec.generate_ids(p, sampled)
        assert got == base.generate_ids(p, sampled)[0]
        assert metrics.accepted_tokens > 0


def test_greedy_requests_share_the_copys_passes_and_its_measured_curve(model):
    """The copy's pass time by rows is measured at load and shared by every fork. Greedy requests share passes
    (the policy charges them what a row adds); sampled or penalized ones draft alone. A batch of greedy requests
    drafts in passes over several rows, which the curve records, and its text is plain decoding's."""
    from specdec.drafters.base import DraftRequest

    target = loaded(model, "kernels", slots=4)
    drafter = create_drafter("quantized", target)
    assert {1, 2, 4, 8, 16} <= set(drafter.passes.table) and drafter.fork().passes is drafter.passes
    assert drafter.passes.ratio(0) == 0 and drafter.passes.ratio(1) == 1 <= drafter.passes.ratio(16)
    for sampling, shares in ((SamplingConfig(), True), (SamplingConfig(temperature=0.7), False),
                             (SamplingConfig(repetition_penalty=1.3), False)):
        fork = drafter.fork()
        fork.begin(DraftRequest(prompt_ids=[1, 2], sampling=sampling))
        assert (fork.pass_sharing() is drafter.passes) == shares
    rows = []
    observe = drafter.passes.observe
    drafter.passes.observe = lambda n, seconds: (rows.append(n), observe(n, seconds))
    spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    prompts = [[1, 2, 3], list(range(10, 40)), [7] * 9]
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    want = [SpecDecoder(target, None).generate_ids(p, config)[0] for p in prompts]
    assert [r.token_ids for r in spec.generate_many(prompts, config)] == want
    assert max(rows) >= len(prompts)


def test_the_quantized_drafter_refuses_what_it_cannot_run(model):
    with pytest.raises(ConfigError, match="runs on the CPU kernels"):
        create_drafter("quantized", loaded(model, "torch"))
    odd = tiny_llama(seed=1, hidden=48, heads=3, kv_heads=1, layers=1)
    with pytest.raises(ConfigError, match="hidden size 48 is not a multiple of 32"):
        create_drafter("quantized", loaded(odd, "kernels"))


class _CountingCopy:
    """A stand-in for the 4-bit copy: after token t it predicts t + 1 (mod V); it counts its passes."""

    def __init__(self, vocab: int):
        self.vocab, self.passes, self.fed = vocab, 0, []

    def forward(self, ids, offsets, slots, starts, positions, masks, keys, values, rows, layers, bf16, aux, argmax_only):
        self.passes += 1
        bounds = offsets.tolist()
        self.fed.append([(int(slot), int(start), ids[a:b].tolist())
                         for slot, start, a, b in zip(slots, starts, bounds, bounds[1:])])
        assert positions.tolist() == [s + i for s, a, b in zip(starts.tolist(), bounds, bounds[1:]) for i in range(b - a)]
        return torch.nn.functional.one_hot((ids + 1) % self.vocab, self.vocab).float() * 5, None, None


def test_prompt_lookup_rides_along_and_the_copy_keeps_what_it_agrees_with():
    """Greedy: the lookup guess after [.. 1 2] in [1 2 3 4 5 9 1 2] is [3 4 5 9 ...]; a copy that predicts t + 1
    agrees with 3 4 5, then drafts 6 itself, all in the first pass; the rest of k comes one pass a token (no guess
    follows [5 6]), fed where the verify pass will score it. A guess found after a later draft rides along too."""
    from types import SimpleNamespace

    from specdec.costs import SharedPasses
    from specdec.drafters.base import Budget, DraftJob, DraftRequest
    from specdec.drafters.models.quantized import QuantizedCopyDrafter
    from specdec.models.backend import SequenceCache

    vocab = 16
    target = SimpleNamespace(info=SimpleNamespace(vocab_size=vocab, device=torch.device("cpu")), max_context=64,
                             pool=SimpleNamespace(keys=None, values=None))
    copy = _CountingCopy(vocab)
    drafter = QuantizedCopyDrafter(target, copy, passes=SharedPasses({1: 1.0}))  # a fake copy: nothing to time
    context = [1, 2, 3, 4, 5, 9, 1, 2]
    drafter.begin(DraftRequest(prompt_ids=context, target_cache=SequenceCache(length=len(context) - 1, slot=3)))
    draft = drafter.propose(context, Budget(6))
    assert draft.tokens.tolist() == [3, 4, 5, 6, 7, 8]
    assert copy.passes == 3  # one pass for 3 4 5 6, then 7 and 8
    assert copy.fed == [[(3, 7, [2, 3, 4, 5, 9, 1])], [(3, 11, [6])], [(3, 12, [7])]]
    assert drafter.propose(context, Budget(2)).tokens.tolist() == [3, 4]
    # a cache that is not one token behind the context (the engine's invariant broken) drafts nothing
    assert drafter.propose(context + [3], Budget(4)).tokens.numel() == 0

    # two requests drafted together share each pass, each in its own slot and at its own positions
    other = drafter.fork()
    other_context = [7, 7, 7, 1]
    other.begin(DraftRequest(prompt_ids=other_context, target_cache=SequenceCache(length=3, slot=5)))
    copy.passes, copy.fed = 0, []
    made = drafter.propose_together([DraftJob(drafter, context, 5), DraftJob(other, other_context, 2)])
    assert [d.tokens.tolist() for d in made] == [[3, 4, 5, 6, 7], [2, 3]]
    assert copy.passes == 2
    assert copy.fed == [[(3, 7, [2, 3, 4, 5, 9]), (5, 3, [1])], [(3, 11, [6]), (5, 4, [2])]]

    # no guess follows [9 2]; after the copy's 3, [2 3] was seen at the start: 4 5 6 0 ride along, 4 5 6 agreed
    later = drafter.fork()
    later_context = [2, 3, 4, 5, 6, 0, 9, 2]
    later.begin(DraftRequest(prompt_ids=later_context, target_cache=SequenceCache(length=7, slot=2)))
    copy.passes, copy.fed = 0, []
    assert later.propose(later_context, Budget(6)).tokens.tolist() == [3, 4, 5, 6, 7, 8]
    assert copy.fed == [[(2, 7, [2])], [(2, 8, [3, 4, 5, 6, 0])], [(2, 12, [7])]]


def test_the_copys_logits_are_a_4_bit_screen_with_its_highest_rescored_in_8_bits(model):
    """Each row's 16 highest 4-bit logits are replaced by the 8-bit LM head's own values (bit for bit those of the
    8-bit product), the others keep their 4-bit values."""
    from specdec import kernels

    backend = loaded(model, "kernels").backend
    cache = backend.new_cache()
    ids = torch.arange(1, 12)
    logits, hidden, _ = backend.four_bit_copy().forward(
        ids, torch.tensor([0, len(ids)]), torch.tensor([cache.slot]), torch.tensor([0]), torch.arange(len(ids)),
        torch.empty(0, dtype=torch.uint8), backend.pool.keys, backend.pool.values, torch.arange(len(ids)), 0, False,
        torch.empty(0, dtype=torch.long), False)
    head = model.lm_head.weight.detach()
    screen = kernels.load().quantized_matmul(hidden, head, 4)
    exact = kernels.load().quantized_matmul(hidden, head, 8)
    top = screen.topk(16, dim=-1).indices
    rescored = torch.zeros_like(screen, dtype=torch.bool).scatter_(1, top, True)
    assert torch.equal(logits[rescored], exact[rescored])
    assert torch.equal(logits[~rescored], screen[~rescored])
