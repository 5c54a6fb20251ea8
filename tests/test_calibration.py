"""Calibrated trees: acceptance observed per draft depth and confidence bucket replaces a head's raw confidence in
scoring and sizing its trees; the output stays exactly the target's."""
import torch

from specdec.speculation_config import SpeculationConfig
from specdec.drafters.heads.calibration import Calibration, accepted_path, node_depths
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.engine import SpecDecoder
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama


def test_without_observations_the_calibrated_chance_is_the_heads_own():
    cal = Calibration()
    q = torch.tensor([0.05, 0.3, 0.77, 0.99])
    torch.testing.assert_close(cal.probability(1, q), q)


def test_observed_acceptance_moves_the_bucket_it_was_seen_in_only():
    cal = Calibration(prior=20.0)
    # an under-confident head: nodes under the root at q = 0.15 were accepted 90 times in 100
    for i in range(100):
        cal.observe([1], [0.15], [-1], {0} if i % 10 else set())
    assert float(cal.probability(1, torch.tensor(0.15))) > 0.75
    assert abs(float(cal.probability(1, torch.tensor(0.55))) - 0.55) < 1e-6  # another bucket: untouched
    assert abs(float(cal.probability(2, torch.tensor(0.15))) - 0.15) < 1e-6  # another depth: untouched
    # a child is tried only where its parent was accepted
    cal.observe([1, 2], [0.9, 0.15], [-1, 0], set())
    assert int(cal.trials[1].sum()) == 0 and int(cal.trials[0].sum()) == 101


def test_the_accepted_path_follows_the_tokens_the_context_gained():
    #        root -> 5 (0) -> 7 (2) -> 9 (4)
    #             -> 6 (1) -> 7 (3)
    tokens, parents = [5, 6, 7, 7, 9], [-1, -1, 0, 1, 2]
    assert node_depths(parents) == [1, 1, 2, 2, 3]
    assert accepted_path(tokens, parents, [6, 7, 1]) == {1, 3}  # the bonus token 1 matches no child
    assert accepted_path(tokens, parents, [5, 7, 9, 4]) == {0, 2, 4}
    assert accepted_path(tokens, parents, [8]) == set()


def test_calibrated_trees_learn_and_keep_greedy_output():
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, "torch")
    torch.manual_seed(1)
    head = new_head(model, "tiny", torch.arange(model.config.vocab_size))
    calibration = Calibration()
    drafter = EagleDrafter(head, tree=True, width=3, calibration=calibration)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    assert drafted_keeping_greedy_output(decoder, target) > 0
    assert calibration.trials.sum() > 0  # the trees' outcomes were counted
    assert drafter.fork().calibration is calibration  # shared by every request of the drafter
