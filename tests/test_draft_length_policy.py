"""The adaptive draft-length policy of one request: k grows while drafts are accepted, drafting pauses when they
miss and is probed again only where it could pay, costly drafts shorten k, trees take the whole cap or nothing,
and a new request starts from the acceptance earlier requests saw."""
import random

from specdec.costs import CostModel
from specdec.policy import DraftLengthPolicy, plan_alone
from cost_curves import flat_costs


def test_a_new_request_starts_from_what_earlier_requests_were_accepted_at():
    """Two early misses switch drafting off for a pause in a fresh policy, but not in one whose kind of drafter
    was accepted at 90% over earlier requests."""
    costs = CostModel({1: 0.0108, 2: 0.013, 4: 0.0153, 8: 0.0234, 16: 0.0433}).for_drafter("eagle")  # AVX2 Zen 3

    def drafts_after_two_misses(policy: DraftLengthPolicy) -> bool:
        for _ in range(2):
            k = policy.step()
            policy.observe(k, 0)
        return policy.step() > 0

    assert not drafts_after_two_misses(DraftLengthPolicy(8, CostModel(dict(costs.table))))
    rng = random.Random(0)
    for _ in range(30):  # earlier requests
        earlier = DraftLengthPolicy(8, costs)
        for _ in range(20):
            k = earlier.step()
            earlier.observe(k, next((i for i in range(k) if rng.random() > 0.9), k))
    informed = DraftLengthPolicy(8, costs)
    assert informed.acceptance()[0] > 0.75
    assert drafts_after_two_misses(informed)
    assert DraftLengthPolicy(8, costs.for_drafter("ngram")).acceptance()[0] == 0.5  # another kind starts afresh


def test_a_tree_whose_every_level_was_accepted_counts_no_miss_below_it():
    """A tree 3 levels deep (12 nodes) accepted to its last level: levels 1-3 were tried and accepted, and nothing
    was tried at a fourth level it did not draft."""
    policy = DraftLengthPolicy(8, flat_costs())
    policy.observe(12, 3, positions=3)
    assert policy.tried[:4] == [1.0, 1.0, 1.0, 0.0] and policy.accepted[:3] == [1.0, 1.0, 1.0]


def test_k_grows_to_the_maximum_when_everything_is_accepted():
    policy = DraftLengthPolicy(8, flat_costs())
    for _ in range(20):
        k = policy.step()
        policy.observe(k, k)
    assert policy.step() == 8


def test_speculation_switches_off_when_drafts_miss_and_retries_later():
    policy = DraftLengthPolicy(8, flat_costs())
    for _ in range(20):
        k = policy.step()
        policy.observe(k, 0)
        if k == 0:
            break
    assert policy.step() == 0
    retried = False
    for _ in range(40):
        k = policy.step()
        policy.observe(k, 0)
        retried |= k > 0
    assert retried, "the policy never tried speculation again"


def test_expensive_drafts_shorten_k():
    cheap, costly = flat_costs(), flat_costs()
    costly.observe_draft(4, 4 * 0.005)
    a, b = DraftLengthPolicy(8, cheap), DraftLengthPolicy(8, costly)
    rng = random.Random(0)
    for _ in range(30):
        accepted = next((i for i in range(8) if rng.random() > 0.8), 8)  # each position kept with chance 0.8
        a.observe(8, accepted)
        b.observe(8, accepted)
    assert 0 < b.step() < a.step()


def test_fixed_k_when_not_adaptive():
    policy = DraftLengthPolicy(5, flat_costs(), adaptive=False)
    policy.observe(5, 0)
    assert policy.step() == 5


def test_trees_size_themselves_but_stop_drafting_when_it_does_not_pay():
    """A tree drafter gets the whole cap while drafts pay, and nothing once they miss (then retries later)."""
    costs = flat_costs()
    tree = DraftLengthPolicy(6, costs)
    assert plan_alone(tree, costs, 6, sizing="tree").commit()[0] == 6
    for _ in range(30):
        tree.observe(6, 0)
    ks = [plan_alone(tree, costs, 6, sizing="tree").commit()[0] for _ in range(12)]
    assert ks[0] == 0 and 6 in ks  # paused first, then a retry with a full tree
    assert 0 < plan_alone(DraftLengthPolicy(6, costs), costs, 6).commit()[0] <= 6


def test_a_probe_follows_a_pause_when_only_a_stale_cost_keeps_drafting_off():
    """After cheap drafts, one slow spell (20 s a draft) makes every k look unprofitable; the first step after
    the pause drafts anyway, and once cheap drafts are measured again, drafting resumes."""
    costs = flat_costs()
    costs.observe_draft(1, 0.0001)
    costs.observe_draft(1, 20.0, weight=1.0)
    policy = DraftLengthPolicy(8, costs)
    ks = [policy.step() for _ in range(policy.first_cooldown + 2)]
    assert ks[0] == 0 and ks[-1] > 0, ks  # paused, then the probe
    costs.observe_draft(ks[-1], ks[-1] * 0.0001, weight=1.0)  # the probe's drafts were cheap and accepted
    policy.observe(ks[-1], ks[-1])
    assert policy.step() > 0


def test_a_cheap_drafter_that_kept_missing_is_probed_after_each_pause():
    """Acceptance varies along a text (an EAGLE head): after a run of misses the estimates say no, but a cheap
    drafter drafts again once each pause ends, and a hit there brings drafting back."""
    costs = flat_costs()
    costs.observe_draft(4, 4 * 0.0002)
    policy = DraftLengthPolicy(8, costs)
    for _ in range(30):
        policy.observe(8, 0)
    ks = [policy.step() for _ in range(policy.first_cooldown + 2)]
    assert ks[0] == 0 and ks[-1] > 0, ks
    policy.observe(ks[-1], ks[-1])
    assert policy.step() > 0


def test_no_probe_when_drafts_would_not_pay_at_any_measured_cost():
    """A drafter as costly as half a target pass per token whose drafts are never accepted (layer-skip on a
    model not trained for it): pauses end without drafting, as probes would cost more than they could find."""
    costs = flat_costs()
    costs.observe_draft(2, 2 * 0.010)
    policy = DraftLengthPolicy(8, costs)
    for _ in range(20):
        policy.observe(2, 0)
    assert [policy.step() for _ in range(100)] == [0] * 100


def test_no_probe_when_drafts_would_only_just_pay_at_the_prior():
    """Drafts that would gain a few percent at the prior acceptance (a costly drafter on a noisy curve) are not
    probed after a pause; a drafter with a clear expected gain is."""
    from specdec.policy import PROBE_MARGIN

    for per_token, probed in ((0.008, False), (0.0002, True)):
        costs = flat_costs()
        costs.observe_draft(1, per_token)
        policy = DraftLengthPolicy(8, costs)
        gain = 1.5 / (costs.verify_s(2) + per_token) * costs.verify_s(1) - 1  # one draft at acceptance 0.5
        assert (gain > PROBE_MARGIN) == probed and gain > 0
        for _ in range(20):
            policy.observe(2, 0)
        ks = [policy.step() for _ in range(policy.first_cooldown + 2)]
        assert (ks[-1] > 0) == probed, ks
