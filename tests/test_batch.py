"""Batched speculative decoding: ragged sequences in one pass give exactly what each gives alone."""
import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.kernels import has_bf16_products
from specdec.costs import CostModel
from specdec.policy import DraftLengthPolicy, plan_lengths
from tiny import loaded, ragged_prompts, random_medusa_heads, tiny_llama


@pytest.mark.parametrize("backend,dtype", [("kernels", torch.float32), ("kernels", torch.bfloat16),
                                           pytest.param("kernels-bf16", torch.bfloat16, marks=pytest.mark.skipif(
                                               not has_bf16_products(), reason="the CPU lacks AVX-512 BF16")),
                                           ("torch", torch.float32), ("hf", torch.float32)])
@pytest.mark.parametrize("kind", ["ngram", "self"])
def test_batched_speculation_equals_each_sequence_alone(backend, dtype, kind):
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2).to(dtype)
    target = loaded(model, backend, dtype=dtype)
    drafter = NgramDrafter(1, 3) if kind == "ngram" else DraftModelDrafter(loaded(model, backend, dtype=dtype).backend, 64)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=5))
    alone = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    engine = decoder.batch_engine(max_batch=5)
    prompts = ragged_prompts()
    want = [alone.generate_ids(p, config)[0] for p in prompts]
    got, queue = {}, list(enumerate(prompts))
    while queue or len(engine):
        while queue and engine.free_slots:  # requests join between steps
            i, p = queue.pop(0)
            engine.submit(i, p, config)
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
    assert [got[i] for i in range(len(prompts))] == want


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_requests_with_the_same_prompt_share_one_prefill(backend):
    """n choices (or repeated requests) over one prompt: the prefill pass scores it once and the others get a copy
    of its cache; every request's output equals its own, greedy and sampled."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, backend)
    coupled = SpeculationConfig(num_speculative_tokens=4, sampling_verifier="coupled")  # seed-stable samples
    decoder = SpecDecoder(target, NgramDrafter(1, 3), coupled)
    prompt, other = ragged_prompts()[5], ragged_prompts()[6]
    configs = [GenerationConfig(max_new_tokens=20, ignore_eos=True)] + [
        GenerationConfig.create(max_new_tokens=20, ignore_eos=True, temperature=1.0, seed=s) for s in (1, 2)]
    scored = []
    forward_batch = target.backend.forward_batch
    target.backend.forward_batch = lambda caches, ids, **kw: scored.append([len(x) for x in ids]) or forward_batch(
        caches, ids, **kw)
    engine = decoder.batch_engine(max_batch=4)
    states = [engine.submit(i, prompt, c) for i, c in enumerate(configs)] + [engine.submit(3, other, configs[0])]
    while len(engine):
        engine.step()
    target.backend.forward_batch = forward_batch
    assert sorted(scored[0]) == sorted([len(prompt), len(other)])  # the first pass: each prompt once
    for state, (p, c) in zip(states, [(prompt, c) for c in configs] + [(other, configs[0])]):
        assert state.generated == SpecDecoder(target, None, coupled).generate_ids(p, c)[0]


@pytest.mark.parametrize("first_length", [1, 5])
def test_a_shared_prefill_survives_its_lead_ending_at_once(first_length):
    """Identical prompts prefilled together: the lead (the first admitted) may end in its first token (one token
    asked, or the stop token) and free its cache before the others copy it; they still get the prompt's cache and
    their own output. A later admission reuses the freed slot without touching theirs."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, "torch")
    decoder = SpecDecoder(target, NgramDrafter(1, 3), SpeculationConfig(num_speculative_tokens=3))
    alone = SpecDecoder(target, None)
    prompt = ragged_prompts()[7]
    configs = [GenerationConfig(max_new_tokens=first_length, ignore_eos=True)] + \
        [GenerationConfig(max_new_tokens=12, ignore_eos=True)] * 2
    engine = decoder.batch_engine(max_batch=4)
    for i, config in enumerate(configs):
        engine.submit(i, prompt, config)
    got = {}
    while len(engine):
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
        if 3 not in got and len(engine) < 3:
            engine.submit(3, ragged_prompts()[8], configs[1])
            got[3] = []
    assert [got[i] for i in range(3)] == [alone.generate_ids(prompt, c)[0] for c in configs]
    assert got[3] == alone.generate_ids(ragged_prompts()[8], configs[1])[0]


def test_cancel_frees_the_slot_at_once():
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    decoder = SpecDecoder(loaded(model, "kernels"), NgramDrafter(1, 3))
    engine = decoder.batch_engine(max_batch=2)
    engine.submit("a", [1, 2, 3], GenerationConfig(max_new_tokens=50, ignore_eos=True))
    engine.submit("b", [4, 5, 6], GenerationConfig(max_new_tokens=50, ignore_eos=True))
    engine.step()
    assert engine.free_slots == 0
    engine.cancel("a")
    assert engine.free_slots == 1 and "a" not in engine.running
    engine.submit("c", [7, 8], GenerationConfig(max_new_tokens=5, ignore_eos=True))
    events = engine.step()
    assert {e.request_id for e in events} == {"b", "c"}


def test_sampling_in_a_batch_is_reproducible_per_seed():
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    decoder = SpecDecoder(loaded(model, "kernels"), NgramDrafter(1, 3),
                          SpeculationConfig(num_speculative_tokens=4, sampling_verifier="coupled"))
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True, sampling=SamplingConfig(temperature=0.9, seed=11))
    alone = decoder.generate_ids([3, 1, 4, 1, 5], config)[0]
    results = decoder.generate_many([[9, 9, 9], [3, 1, 4, 1, 5], [2, 7]], config)
    assert results[1].token_ids == alone


def test_speculation_shrinks_as_the_batch_grows():
    # memory-bound up to 4 tokens a pass (free drafts), compute-bound beyond (each token costs its share)
    costs = CostModel({T: 0.010 * max(1.0, T / 4) for T in (1, 2, 4, 8, 16, 32, 64, 128)})

    def policies(n):
        out = []
        for _ in range(n):
            p = DraftLengthPolicy(8, costs)
            for _ in range(10):
                p.observe(8, 5)
            out.append(p)
        return out

    alone = sum(plan_lengths(policies(1), costs, [8]).commit())
    per_seq_2 = sum(plan_lengths(policies(2), costs, [8] * 2).commit()) / 2
    per_seq_16 = sum(plan_lengths(policies(16), costs, [8] * 16).commit()) / 16
    assert alone >= 3 and alone > per_seq_2 > per_seq_16
    assert per_seq_16 == 0  # a full compute-bound batch gains nothing from drafts


@pytest.mark.parametrize("kind", ["eagle", "medusa", "select"])
@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_tree_drafts_when_alone_and_chains_in_a_batch_keep_greedy_output(monkeypatch, backend, kind):
    """An EAGLE or Medusa drafter (or the select drafter choosing between Medusa heads and prompt lookup) drafts
    trees while its sequence runs alone and chains once others join; the tokens stay exactly each sequence's plain
    greedy output either way."""
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head
    from specdec.drafters.heads.medusa import MedusaDrafter

    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, backend)
    torch.manual_seed(1)
    vocab = torch.arange(model.config.vocab_size)
    if kind == "eagle":
        drafter = EagleDrafter(new_head(model, "tiny", vocab), tree=True, width=3)
    else:
        drafter = MedusaDrafter(random_medusa_heads(model), tree=True, width=3)
    if kind == "select":
        from specdec.drafters.routing.select import SelectingDrafter

        drafter = SelectingDrafter([drafter, NgramDrafter()])
    # fixed lengths: what is asked here is the draft's shape, alone and in a batch, not whether drafting pays
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    alone = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    prompts = ragged_prompts(4)
    want = [alone.generate_ids(p, config)[0] for p in prompts]
    engine = decoder.batch_engine(max_batch=4)
    got, budgets, step = {}, [], 0  # budgets: (step, whether it allowed a tree) of every drafter call
    propose = type(drafter).propose

    def recording(self, context, budget):
        budgets.append((step, budget.tree))
        return propose(self, context, budget)

    monkeypatch.setattr(type(drafter), "propose", recording)
    engine.submit(0, prompts[0], config)
    for step in range(40):
        if step == 6:  # the others join after the first has drafted alone for a while
            for i, p in enumerate(prompts[1:], 1):
                engine.submit(i, p, config)
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
        if not len(engine):
            break
    assert [got[i] for i in range(len(prompts))] == want
    assert any(tree for s, tree in budgets if 1 <= s < 6)  # alone: trees allowed
    assert any(not tree for s, tree in budgets if s >= 7)  # batched: chains only


@pytest.mark.parametrize("p_min", [0.0, 0.3])
def test_a_draft_model_drafts_a_batch_in_shared_passes_the_drafts_each_would_alone(p_min):
    """Greedy requests drafting with one draft model share each pass (one pass a drafted token, every request's
    latest token in it), and each gets the chain it would draft alone, the confidence stop included; sampled and
    penalized requests draft alone."""
    from specdec.drafters.base import DraftJob, DraftRequest

    draft = loaded(tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2), "kernels").backend
    root = DraftModelDrafter(draft, 64, p_min=p_min)
    contexts = ragged_prompts(5)[1:]
    ks = [5, 2, 6, 4]

    def drafters():
        out = []
        for context in contexts:
            d = root.fork()
            d.begin(DraftRequest(prompt_ids=context))
            out.append(d)
        return out

    passes = []
    forward_batch = draft.forward_batch
    draft.forward_batch = lambda caches, ids, **kw: passes.append(len(ids)) or forward_batch(caches, ids, **kw)
    together = drafters()
    slots, held = draft.pool.slots, [d.cache.length for d in together]
    shared = together[0].pass_sharing()  # timed in that request's own cache: no slot taken, nothing it holds moved
    assert shared is not None and all(d.pass_sharing() is shared for d in together)  # one table for every fork
    assert draft.pool.slots == slots and [d.cache.length for d in together] == held
    assert root.pass_sharing() is None  # drafting for no request
    # twice: the second call rolls each draft cache back to what it shares with the context (the last token fed)
    for _ in range(2):
        passes.clear()
        made = together[0].propose_together([DraftJob(d, c, k) for d, c, k in zip(together, contexts, ks)])
        alone = [d.propose(c, Budget(k)) for d, c, k in zip(drafters(), contexts, ks)]
        assert [m.tokens.tolist() for m in made] == [a.tokens.tolist() for a in alone]
        lengths = [len(m) for m in made]
        assert len(passes) == max(lengths) and passes[0] == len(contexts)  # one pass a drafted token, shared
        assert all(1 <= n <= k for n, k in zip(lengths, ks)) and (p_min > 0 or lengths == ks)
    draft.forward_batch = forward_batch
    sampled = root.fork()
    sampled.begin(DraftRequest(prompt_ids=contexts[0], sampling=SamplingConfig(temperature=1.0)))
    penalized = root.fork()
    penalized.begin(DraftRequest(prompt_ids=contexts[0], sampling=SamplingConfig(repetition_penalty=1.3)))
    assert sampled.pass_sharing() is None and penalized.pass_sharing() is None
