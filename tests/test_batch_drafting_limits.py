"""When a batch drafts: a batch the policy gives no drafts asks again after a few steps or when its size changes, a
batch at its last tokens does not stop the next from drafting, and no drafter runs while the batch is over
max_batch_for_drafting."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.drafters.base import Budget, Draft, Drafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.policy import LengthPlan
from specdec.speculation_config import SpeculationConfig
from tiny import loaded, ragged_prompts, tiny_llama


def test_a_batch_given_no_drafts_asks_the_policy_again_after_a_few_steps(monkeypatch):
    """Where the policy gives a batch no drafts (large batches, where drafts do not pay), it is asked again after
    IDLE_RECHECK steps at the same size, and at once when the batch's size changes."""
    from specdec import drafting

    asked = []

    def no_drafts(policies, costs, caps, shared=None):
        asked.append(len(policies))
        return LengthPlan([0] * len(policies), policies, [None] * len(policies))

    monkeypatch.setattr(drafting, "plan_lengths", no_drafts)
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    engine = SpecDecoder(loaded(model, "kernels"), NgramDrafter(1, 3)).batch_engine(max_batch=3)
    for name in "abc":
        engine.submit(name, [1, 2, 3], GenerationConfig(max_new_tokens=60, ignore_eos=True))
    engine.step()  # the prefill
    for _ in range(2 * (drafting.IDLE_RECHECK + 1)):
        engine.step()
    assert asked == [3, 3]
    engine.cancel("a")
    engine.step()
    assert asked == [3, 3, 2]


def test_a_batch_at_its_last_tokens_does_not_keep_the_next_batch_from_drafting():
    """Requests at their last token have no room for drafts, so their batch's plan is empty; that says nothing of
    whether drafts pay, and the batch that runs next at the same size drafts at once (drafting fixed, not adaptive)."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    speculation = SpeculationConfig(num_speculative_tokens=2, adaptive=False)
    engine = SpecDecoder(loaded(model, "kernels"), _RepeatDrafter([]), speculation).batch_engine(max_batch=2)
    for name in "ab":
        engine.submit(name, [1, 2, 3], GenerationConfig(max_new_tokens=2, ignore_eos=True))
    engine.step()  # the prefill: one token each
    engine.step()  # their last token: no room for drafts
    assert not len(engine)
    states = [engine.submit(name, [4, 5, 6], GenerationConfig(max_new_tokens=30, ignore_eos=True)) for name in "cd"]
    engine.step()  # their prefill
    engine.step()
    assert all(s.metrics.drafted_tokens == 2 for s in states)


class _RepeatDrafter(Drafter):
    """Drafts k copies of the last token (every call drafts, whatever the acceptance) and logs each call's k in a
    list its forks share."""

    name = "repeat"

    def __init__(self, calls: list[int]):
        self.calls = calls

    def propose(self, context: list[int], budget: Budget) -> Draft:
        self.calls.append(budget.k)
        return Draft(tokens=torch.tensor([context[-1]] * budget.k))

    def fork(self) -> "_RepeatDrafter":
        return _RepeatDrafter(self.calls)


def _steps_with_limit(target, limit):
    """Five sequences of different lengths decoded together, drafting 3 tokens a step (adaptive off, so only the
    limit can stop drafts): per step (sequences verified, drafter calls, tokens drafted), and the states."""
    calls: list[int] = []
    speculation = SpeculationConfig(num_speculative_tokens=3, adaptive=False, max_batch_for_drafting=limit)
    engine = SpecDecoder(target, _RepeatDrafter(calls), speculation).batch_engine(max_batch=5)
    states = [engine.submit(i, p, GenerationConfig(max_new_tokens=n, ignore_eos=True))
              for i, (p, n) in enumerate(zip(ragged_prompts(5), (6, 10, 14, 30, 40)))]
    rows = []
    while len(engine):
        running, before, drafted = len(engine.running), len(calls), sum(s.metrics.drafted_tokens for s in states)
        engine.step()
        rows.append((running, len(calls) - before, sum(s.metrics.drafted_tokens for s in states) - drafted))
    return rows, states


def test_no_drafts_while_the_batch_is_over_the_limit():
    """With max_batch_for_drafting = 2, steps verifying 3 or more sequences call no drafter and draft nothing; once
    sequences finish and 2 or fewer are left, drafting resumes; the tokens stay each sequence's plain greedy output."""
    target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2), "kernels")
    unlimited, _ = _steps_with_limit(target, None)
    assert any(calls and drafted for running, calls, drafted in unlimited if running > 2)  # without it, big steps draft
    rows, states = _steps_with_limit(target, 2)
    big = [(calls, drafted) for running, calls, drafted in rows if running > 2]
    small = [(calls, drafted) for running, calls, drafted in rows if 0 < running <= 2]
    assert len(big) >= 4 and all(calls == drafted == 0 for calls, drafted in big)
    assert sum(drafted for _, drafted in small) > 0 and all(calls > 0 for calls, _ in small[:3])
    plain = SpecDecoder(target, None)
    for state in states:
        assert state.generated == plain.generate_ids(state.tokens[: state.prompt_len], state.config)[0]


@pytest.mark.parametrize("limit", [0, -3, 2.5, True, "4"])
def test_max_batch_for_drafting_must_be_an_integer_of_at_least_one(limit):
    with pytest.raises(ConfigError, match="max_batch_for_drafting must be an integer >= 1"):
        SpeculationConfig(max_batch_for_drafting=limit)
