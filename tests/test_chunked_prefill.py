"""Chunked prefill: a long prompt that arrives while others run is prefilled a budget of tokens a step, every running
request still steps each time, and no output changes (greedy, or sampled with a seed), on the CPU kernels."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.kernels import has_bf16_products
from specdec.models import kernel_llama
from specdec.prefill import MIN_CHUNK_TOKENS, ChunkBudget, parse_prefill_chunk, plan_prefill
from tiny import kernel_head, loaded, random_medusa_heads, tiny_llama

VARIANTS = [("kernels", torch.float32), ("kernels", torch.bfloat16),
            pytest.param("kernels-bf16", torch.bfloat16, marks=pytest.mark.skipif(
                not has_bf16_products(), reason="the CPU lacks AVX-512 BF16"))]
CONFIGS = {"greedy": GenerationConfig(max_new_tokens=24, ignore_eos=True),
           "sampled": GenerationConfig.create(max_new_tokens=24, temperature=0.9, top_p=0.95, seed=11,
                                              ignore_eos=True)}


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 63, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _decoder(backend, dtype, drafter=None):
    target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2).to(dtype), backend, dtype=dtype, slots=4)
    coupled = SpeculationConfig(num_speculative_tokens=4, sampling_verifier="coupled")  # seed-stable samples
    return SpecDecoder(target, drafter, coupled)


def _serve(decoder, prompts, config, prefill_chunk, arrive_at):
    """Runs the prompts through one engine, prompt i joining at step arrive_at[i]; returns each output and, per
    step, (the prompt tokens it prefilled, whether every request running before it stepped, how many were)."""
    engine = decoder.batch_engine(max_batch=4, prefill_chunk=prefill_chunk)
    got, steps, step = {}, [], 0
    while len(got) < len(prompts) or len(engine):
        for i, p in enumerate(prompts):
            if arrive_at[i] == step:
                engine.submit(i, p, config)
        waiting = [(r, r.cache.length) for _, r in engine.waiting]
        running = set(engine.running)
        events = engine.step()
        prefilled = sum(r.cache.length - before for r, before in waiting if r.prompt_len > before)
        stepped = {e.request_id for e in events} >= running
        steps.append((prefilled, stepped, len(running)))
        for e in events:
            got.setdefault(e.request_id, []).extend(e.new_tokens)
        step += 1
    return [got[i] for i in range(len(prompts))], steps


@pytest.mark.parametrize("backend,dtype", VARIANTS)
@pytest.mark.parametrize("sampling", ["greedy", "sampled"])
@pytest.mark.parametrize("drafted", [False, True])
def test_a_long_prompt_prefilled_in_chunks_changes_no_output(backend, dtype, sampling, drafted):
    """Two short requests run while a 150-token prompt arrives: with a budget of 16 tokens a step prefills at most
    16 of its tokens while they run, they step at every such step, and every output equals the unchunked run's."""
    decoder = _decoder(backend, dtype, NgramDrafter(1, 3) if drafted else None)
    prompts, arrive_at = [_prompt(5, 1), _prompt(7, 2), _prompt(150, 3)], [0, 0, 2]
    want, unchunked = _serve(decoder, prompts, CONFIGS[sampling], None, arrive_at)
    got, chunked = _serve(decoder, prompts, CONFIGS[sampling], 16, arrive_at)
    assert got == want
    assert max(n for n, _, others in unchunked if others) == 150  # without chunks, the running ones waited for it
    with_others = [(n, stepped) for n, stepped, others in chunked if others and n]
    assert len(with_others) >= 3 and all(n <= 16 and stepped for n, stepped in with_others)


def _feature_reader(kind: str):
    """A drafter that reads the target's features, drafting chains of fixed length (no tree sized by timings): an
    EAGLE head on the kernels, or Medusa heads."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    torch.manual_seed(2)
    if kind == "medusa":
        from specdec.drafters.heads.medusa import MedusaDrafter

        return MedusaDrafter(random_medusa_heads(model), tree=False, lookup=False)
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head

    head = new_head(model, "tiny", torch.arange(64))
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return EagleDrafter(kernel_head(head), tree=False, lookup=False)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("prefix_cache", [False, True])
def test_a_drafter_reading_features_gets_a_chunked_prompt_as_it_gets_it_whole(monkeypatch, kind, prefix_cache):
    """A drafter that reads the target's features (EAGLE, Medusa) no longer makes its prompt wait to be prefilled
    whole: a 180-token prompt arriving while another runs is prefilled 16 tokens a step, its chunks' features reach the
    drafter in order (after the rows a prefix cache restored, where it did), and every step drafts exactly what it
    drafts with the prompt prefilled whole; every output equals the unchunked run's."""
    from specdec import scheduler

    decoder = _decoder("kernels", torch.float32, _feature_reader(kind))
    decoder.speculation = SpeculationConfig(num_speculative_tokens=3, adaptive=False)
    if prefix_cache:
        decoder.enable_prefix_cache(2)
    first = _prompt(120, 3)  # ends by step 24; the last prompt begins with it (restored, with a prefix cache)
    prompts, arrive_at = [first, _prompt(7, 2), _prompt(9, 5), first + _prompt(60, 4)], [0, 0, 25, 27]
    drafts, propose_all = [], scheduler.propose_all

    def recording(requests, lengths, solo):
        made = propose_all(requests, lengths, solo)
        drafts.append([(r.tokens[: r.prompt_len], len(r.tokens), d.tokens.tolist()) for r, d in zip(requests, made)])
        return made

    monkeypatch.setattr(scheduler, "propose_all", recording)
    want, unchunked = _serve(decoder, prompts, CONFIGS["greedy"], None, arrive_at)
    whole, drafts = drafts, []
    got, chunked = _serve(decoder, prompts, CONFIGS["greedy"], 16, arrive_at)
    assert got == want
    with_others = [n for n, _, others in chunked if others and n]
    assert len(with_others) >= 3 and max(with_others) <= 16  # the prompts were chunked while others ran
    assert max(n for n, _, others in unchunked if others) > 16

    def by_request(steps):
        out: dict = {}
        for step in steps:
            for prompt, at, tokens in step:
                out.setdefault(tuple(prompt), {})[at] = tokens
        return out

    assert by_request(drafts) == by_request(whole) and any(t for s in drafts for *_, t in s)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_chunk_shares_the_pass_of_a_prompt_whose_prefill_ends_and_changes_no_output(monkeypatch, dtype):
    """A prompt's last part (6 of its 150 tokens, within the 16-token budget) ends its prefill in the step where the
    next prompt begins in chunks: one prefill pass holds both (the weights read once), and the outputs are the
    unchunked run's."""
    decoder = _decoder("kernels", dtype)
    backend = decoder.target.backend
    prompts, arrive_at = [_prompt(5, 1), _prompt(150, 3), _prompt(40, 4)], [0, 1, 2]
    want, _ = _serve(decoder, prompts, CONFIGS["greedy"], None, arrive_at)
    passes, real = [], backend.forward_batch

    def watched(caches, input_ids, **kwargs):
        passes.append([int(i.numel()) for i in input_ids])
        return real(caches, input_ids, **kwargs)

    monkeypatch.setattr(backend, "forward_batch", watched)
    got, _ = _serve(decoder, prompts, CONFIGS["greedy"], 16, arrive_at)
    assert got == want
    assert [6, 10] in passes  # the long prompt's end and the next prompt's first chunk, one pass


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_chunk_of_a_prompt_is_computed_as_a_prefill(monkeypatch, dtype):
    """Where prefills take bfloat16 products (AVX-512 BF16 or AMX CPUs), a chunk after the first must take them too:
    the backend reads a cache marked in_prompt as the prompt's prefill. Checked on any CPU by watching that read."""
    decoder = _decoder("kernels", dtype)
    backend = decoder.target.backend
    passes, real = [], backend.forward_batch

    def watched(caches, input_ids, **kwargs):
        passes.append(([int(i.numel()) for i in input_ids], [kernel_llama._first_pass(c) for c in caches]))
        return real(caches, input_ids, **kwargs)

    monkeypatch.setattr(backend, "forward_batch", watched)
    _serve(decoder, [_prompt(5, 1), _prompt(90, 3)], CONFIGS["greedy"], 16, [0, 1])
    long_prompt = [firsts for lengths, firsts in passes if max(lengths) >= 10]
    assert len(long_prompt) >= 3 and all(all(firsts) for firsts in long_prompt)
    decode = [firsts for lengths, firsts in passes if max(lengths) == 1]
    assert decode and not any(any(firsts) for firsts in decode)


@pytest.mark.parametrize("backend", ["torch", "hf"])
def test_a_backend_whose_chunks_are_not_exact_prefills_prompts_whole(backend):
    decoder = _decoder(backend, torch.float32)
    assert decoder.batch_engine(max_batch=2, prefill_chunk=16).chunks is None
    assert decoder.target.backend.exact_chunks is False


@settings(max_examples=300, deadline=None)
@given(left=st.lists(st.integers(1, 60), max_size=6), budget=st.integers(1, 80), data=st.data())
def test_a_plan_serves_first_come_first_and_keeps_to_its_budget(left, budget, data):
    chunkable = data.draw(st.lists(st.booleans(), min_size=len(left), max_size=len(left)))
    plan = plan_prefill(left, chunkable, budget)
    touched = plan.due + ([plan.chunk[0]] if plan.chunk else [])
    assert touched == list(range(len(touched)))  # a prefix of the queue, in order
    spent = sum(left[i] for i in plan.due) + (plan.chunk[1] if plan.chunk else 0)
    whole_alone = len(plan.due) == 1 and not chunkable[0] and left[0] > budget
    assert spent <= budget or whole_alone
    if plan.chunk:
        assert chunkable[plan.chunk[0]] and 0 < plan.chunk[1] < left[plan.chunk[0]]
    if left:
        assert touched  # every step makes progress
    assert plan_prefill(left, chunkable, None).due == list(range(len(left)))


def test_the_auto_budget_takes_a_step_and_a_half_and_grows_with_the_waiting_over_the_running():
    budget = ChunkBudget("auto")
    first = budget.tokens()
    budget.observe_step(0.100)
    budget.observe_prefill(100, 0.100)  # 1 ms a token
    assert first >= 64 and budget.tokens() == 150  # 1.5 steps of 100 ms
    budget.observe_prefill(8, 10.0)  # a few tokens' pass says little about a token's cost: not counted
    assert budget.tokens(waiting=2, running=16) == 150
    assert budget.tokens(waiting=8, running=2) == 400  # four times as many wait as run: four steps' worth
    assert budget.tokens(waiting=500, running=1) == 2048  # at most MAX_CHUNK_TOKENS
    tiny = ChunkBudget("auto")  # a tiny model's steps: chunks of MIN_CHUNK_TOKENS
    tiny.observe_step(0.001)
    tiny.observe_prefill(100, 0.100)
    assert tiny.tokens() == MIN_CHUNK_TOKENS
    four_bit = ChunkBudget("auto")  # 16 streams over a 4-bit file: 15 ms steps, 0.5 ms a prompt token
    four_bit.observe_step(0.015)
    four_bit.observe_prefill(100, 0.050)
    assert four_bit.tokens() == 45  # the rule's step and a half, not a floor of several steps' time
    assert ChunkBudget(48).tokens(waiting=8, running=2) == 48


@pytest.mark.parametrize("value,want", [("auto", "auto"), ("off", None), (None, None), ("64", 64), (32, 32)])
def test_prefill_chunk_settings(value, want):
    assert parse_prefill_chunk(value) == want


@pytest.mark.parametrize("value", ["0", "-4", "1.5", "many", "", True])
def test_a_bad_prefill_chunk_is_refused(value):
    with pytest.raises(ConfigError, match="prefill chunk"):
        parse_prefill_chunk(value)
