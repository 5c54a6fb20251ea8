"""Confidence stop (--draft-p-min): a draft model or layer-skip stops drafting after the first token it gives a
probability below p_min; drafts only get shorter, and output stays the target's."""
import math

import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.sampling import make_generator
from tiny import TableLM, drafted_keeping_greedy_output, loaded, tiny_llama

K = 6


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def draft_model():
    return tiny_llama(seed=7, hidden=32, heads=2, kv_heads=1)


def _contexts(vocab: int, count: int = 12) -> list[list[int]]:
    gen = torch.Generator().manual_seed(5)
    return [torch.randint(0, vocab, (2 + i % 5,), generator=gen).tolist() for i in range(count)]


def _drafter(kind: str, target, draft_model, p_min: float):
    if kind == "layerskip":
        return create_drafter("layerskip", target, layerskip_layers=1, draft_p_min=p_min)
    return create_drafter("draft-model", target, draft_model=loaded(draft_model, "torch"), draft_p_min=p_min)


def _propose(drafter: DraftModelDrafter, context: list[int], sampling: SamplingConfig | None = None, seed: int = 0):
    drafter.begin(DraftRequest(prompt_ids=context, sampling=sampling or SamplingConfig(),
                               generator=make_generator(seed)))
    return drafter.propose(context, Budget(K))


def test_greedy_draft_stops_exactly_after_the_first_token_below_p_min():
    """p_min just above a position's probability stops there; p_min equal to it does not (below means <). The same
    drafter then drafts on from the context grown by its cut draft as a fresh one does (its cache stays in sync)."""
    lm = TableLM(vocab=16, seed=3, scale=1.5)
    stops = set()
    for context in _contexts(16):
        full = _propose(DraftModelDrafter(lm, 16), context).tokens.tolist()
        assert len(full) == K
        probs = [float(lm.logits_after(context + full[:i]).softmax(-1)[t]) for i, t in enumerate(full)]
        for p in probs:
            for p_min in (p, math.nextafter(p, 1.0)):
                stop = next((i for i, q in enumerate(probs) if q < p_min), K - 1)
                stops.add(stop)
                drafter = DraftModelDrafter(lm, 16, p_min=p_min)
                assert _propose(drafter, context).tokens.tolist() == full[:stop + 1]
                grown = context + full[:stop + 1] + [7]
                again = drafter.propose(grown, Budget(K)).tokens.tolist()
                assert again == _propose(DraftModelDrafter(lm, 16, p_min=p_min), grown).tokens.tolist()
    assert {0, K - 1} < stops  # stops at the first position, in the middle and nowhere were all exercised


def test_sampled_draft_is_the_full_one_cut_with_the_same_q():
    """Under sampling the stop reads q(token) of the drawn token and only truncates: tokens and q rows are those of
    the uncut draft drawn with the same seed."""
    lm, p_min = TableLM(vocab=5, seed=11, scale=2.5), 0.5
    sampling = SamplingConfig(temperature=1.0)
    cut_short = 0
    for seed, context in enumerate(_contexts(5, count=40)):
        full = _propose(DraftModelDrafter(lm, 5), context, sampling, seed)
        drawn = full.probs[torch.arange(K), full.tokens]  # (K,) q of each drawn token
        stop = next((i for i, q in enumerate(drawn.tolist()) if q < p_min), K - 1)
        cut = _propose(DraftModelDrafter(lm, 5, p_min=p_min), context, sampling, seed)
        assert torch.equal(cut.tokens, full.tokens[:stop + 1])
        assert torch.equal(cut.probs, full.probs[:stop + 1])
        cut_short += stop < K - 1
    assert 0 < cut_short < 40


@pytest.mark.parametrize("kind", ["draft-model", "layerskip"])
def test_p_min_near_one_drafts_one_token_a_step(kind, target_model, draft_model):
    target = loaded(target_model, "torch")
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    speculation = SpeculationConfig(num_speculative_tokens=K, adaptive=False)
    plain = SpecDecoder(target, None)
    for p_min, one_a_step in ((0.0, False), (0.999, True)):
        spec = SpecDecoder(target, _drafter(kind, target, draft_model, p_min), speculation)
        for prompt in ([1, 2, 3], list(range(5, 25))):
            got, metrics = spec.generate_ids(prompt, config)
            assert got == plain.generate_ids(prompt, config)[0]
            assert metrics.drafting_steps > 0
            assert (metrics.drafted_tokens == metrics.drafting_steps) == one_a_step


@pytest.mark.parametrize("kind", ["draft-model", "layerskip"])
def test_moderate_p_min_keeps_greedy_output(kind, target_model, draft_model):
    """p_min 0.3 sits among these drafters' probabilities (0.1 to 0.9): drafts get shorter, output stays exact."""
    target = loaded(target_model, "kernels")
    speculation = SpeculationConfig(num_speculative_tokens=K, adaptive=False)
    drafted = {p_min: drafted_keeping_greedy_output(
        SpecDecoder(target, _drafter(kind, target, draft_model, p_min), speculation), target) for p_min in (0.0, 0.3)}
    assert 0 < drafted[0.3] < drafted[0.0]


def test_factories_pass_p_min_and_refuse_bad_values(target_model, draft_model):
    target = loaded(target_model, "torch")
    for kind in ("draft-model", "layerskip"):
        made = _drafter(kind, target, draft_model, 0.4)
        assert made.p_min == made.fork().p_min == 0.4
        for bad in (1.0, -0.1, float("nan"), "0.5"):
            with pytest.raises(ConfigError, match=r"draft_p_min must be in \[0, 1\)"):
                _drafter(kind, target, draft_model, bad)
