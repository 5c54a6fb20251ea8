"""The select drafter: per-step choice among drafters by measured speed, lossless whatever it picks."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.base import Draft, Drafter
from specdec.drafters.heads.medusa import MedusaDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.routing.select import Pending, SelectingDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.metrics import GenerationMetrics
from specdec.request import count_step_metrics
from tiny import drafted_keeping_greedy_output, loaded, random_medusa_heads, tiny_llama


@pytest.fixture(scope="module")
def target():
    return loaded(tiny_llama(seed=0))


def test_a_pending_chain_is_scored_once_the_context_tells():
    p = Pending("x", start=3, tokens=[5, 6, 7], parents=None, size=3, draft_s=0.0)
    assert p.accepted([1, 2, 3]) is None  # nothing after the draft yet
    assert p.accepted([1, 2, 3, 5]) is None  # the first kept, the second not known yet
    assert p.accepted([1, 2, 3, 5, 9]) == 1  # the second differs
    assert p.accepted([1, 2, 3, 5, 6, 7]) == 3  # all kept
    assert p.accepted([1, 2, 3, 4]) == 0


def test_a_pending_tree_follows_the_branch_the_target_took():
    # root -> 5 (0) -> 6 (2) ; root -> 8 (1) -> 9 (3), 4 (4)
    p = Pending("x", start=1, tokens=[5, 8, 6, 9, 4], parents=[-1, -1, 0, 1, 1], size=5, draft_s=0.0)
    assert p.accepted([0, 8]) is None
    assert p.accepted([0, 8, 4]) == 2  # a leaf: nothing deeper to score
    assert p.accepted([0, 8, 7]) == 1
    assert p.accepted([0, 3]) == 0
    assert p.accepted([0, 5, 6, 1]) == 2


class _Known(Drafter):
    """Drafts the target's known greedy continuation of one prompt (always right), or a wrong token (never)."""

    def __init__(self, name: str, continuation: list[int], right: bool, reads_features: bool = False):
        self.name, self.continuation, self.right = name, continuation, right
        self.feature_layers = () if reads_features else None

    def begin(self, request):
        super().begin(request)
        self.start = len(request.prompt_ids)

    def propose(self, context, budget):
        done = len(context) - self.start
        tokens = self.continuation[done: done + budget.k]
        if not self.right:
            tokens = [(t + 1) % 60 for t in tokens]
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long))


@pytest.mark.parametrize("heads", [False, True], ids=["shadowed", "retried"])
def test_select_drafts_mostly_with_the_drafter_that_is_right(target, heads):
    """Both kinds of candidate: context-only ones, scored in the shadow every step, and ones that read features,
    measured when chosen and retried after doubling pauses."""
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    config = GenerationConfig(max_new_tokens=120, ignore_eos=True)
    plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
    drafter = SelectingDrafter([_Known("wrong", plain, right=False, reads_features=heads),
                                _Known("right", plain, right=True, reads_features=heads)])
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=3))
    got, metrics = decoder.generate_ids(prompt, config)
    assert got == plain
    steps = metrics.drafter_steps
    assert steps.get("right", 0) >= 0.85 * sum(steps.values()) and metrics.mean_accepted_tokens > 3.0
    if heads:
        assert steps.get("wrong", 0) <= 5  # tried first, then after pauses of 8, 16, 32 steps
    # the next request starts from this one's estimates: the right drafter first
    _, again = decoder.generate_ids(prompt, config)
    assert again.drafter_steps.get("wrong", 0) <= steps.get("wrong", 0)


def test_select_keeps_the_greedy_output_with_trees_and_chains(target):
    """(Batches: tests/test_batch.py.)"""
    def select():
        return SelectingDrafter([NgramDrafter(), SuffixDrafter(), MedusaDrafter(random_medusa_heads(target.hf_model))])

    for tree in (True, False):
        drafter = select()
        if not tree:
            drafter.candidates["medusa"].tree = False
        decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
        assert drafted_keeping_greedy_output(decoder, target, new_tokens=40) > 0



def test_select_options_are_checked(target):
    assert list(create_drafter("select", target, select_from="suffix,ngram").candidates) == ["suffix", "ngram"]
    assert list(create_drafter("select", target).candidates) == ["ngram", "suffix"]  # no heads for this model
    for bad in ("select", "ngram,telepathy", "ngram,,suffix", "auto"):
        with pytest.raises(ConfigError, match="select-from"):
            create_drafter("select", target, select_from=bad)
    with pytest.raises(ConfigError, match="twice"):
        create_drafter("select", target, select_from="ngram,ngram")


def test_metrics_count_the_steps_of_each_chosen_drafter():
    a, b = GenerationMetrics(), GenerationMetrics()
    count_step_metrics(a, drafted=3, accepted=1, emitted=2, source="ngram")
    count_step_metrics(b, drafted=2, accepted=2, emitted=3, source="eagle")
    count_step_metrics(b, drafted=2, accepted=0, emitted=1, source="ngram")
    count_step_metrics(b, drafted=0, accepted=0, emitted=1)
    merged = a.merge(b)
    assert merged.drafter_steps == {"ngram": 2, "eagle": 1} and merged.steps == 4
    assert "drafted by eagle 1, ngram 2" in merged.summary()
    assert "drafted by" not in GenerationMetrics().summary()
