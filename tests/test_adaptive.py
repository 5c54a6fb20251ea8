"""The adaptive draft-length policy and its cost model."""
import random

from specdec.costs import CostModel
from specdec.policy import DraftLengthPolicy, plan_alone


def flat_costs() -> CostModel:
    return CostModel({1: 0.020, 2: 0.021, 4: 0.022, 8: 0.024, 16: 0.030, 32: 0.045})


def test_cost_model_interpolates_and_extrapolates():
    costs = flat_costs()
    assert costs.verify_s(8) == 0.024
    assert abs(costs.verify_s(12) - 0.027) < 1e-12
    assert costs.verify_s(64) > costs.verify_s(32)
    costs.observe_verify(8, 0.034, weight=0.5)
    assert abs(costs.verify_s(8) - 0.029) < 1e-12


def test_the_cost_curve_never_falls_as_passes_grow():
    """A slow spell at one size pools with the sizes above it instead of making them look cheaper."""
    costs = flat_costs()
    costs.observe_verify(4, 0.040, weight=1.0)  # above what 8 and 16 tokens cost
    curve = [costs.verify_s(T) for T in range(1, 40)]
    assert all(a <= b for a, b in zip(curve, curve[1:]))
    assert abs(costs.verify_s(4) - (0.040 + 0.024 + 0.030) / 3) < 1e-12
    assert costs.table[4] == 0.040  # the measurements themselves are kept


def test_a_new_size_starts_from_the_curve_not_from_one_pass():
    costs = flat_costs()
    costs.observe_verify(5, 0.5)  # one pass, 20 times what the curve says, at a size not timed before
    assert abs(costs.table[5] - (0.1 * 0.5 + 0.9 * 0.0225)) < 1e-12  # 0.0225: the curve's value at 5
    assert costs.verify_s(5) < 0.1 * 0.5 + 0.9 * 0.0225 + 1e-12


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


def test_warm_up_replaces_a_cold_drafting_cost(tiny_folder):
    from specdec.drafters.ngram import NgramDrafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model

    costs = flat_costs()
    costs.for_drafter("ngram").observe_draft(1, 20.0)
    decoder = SpecDecoder(load_model(str(tiny_folder), dtype="float32"), NgramDrafter(1, 3), costs=costs)
    decoder.warm_up()
    assert 0 < costs.for_drafter("ngram").draft_per_token_s < 0.1


def test_a_drafter_built_by_name_after_warm_up_is_warmed_up_too(tiny_folder):
    """A request naming another drafter than the decoder's (a server's `speculation.drafter`) gets one whose
    drafting cost was measured warm, not taken from its cold first call; a decoder never warmed up leaves it."""
    from specdec.drafters.suffix import SuffixDrafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model

    target = load_model(str(tiny_folder), dtype="float32")
    for warm in (True, False):
        costs = flat_costs()
        decoder = SpecDecoder(target, SuffixDrafter(), costs=costs)
        if warm:
            decoder.warm_up()
        costs.for_drafter("ngram").observe_draft(1, 20.0)  # as a cold first call would
        assert decoder.drafter_named("ngram", min_n=1, max_n=3).name == "ngram"
        assert (0 < costs.for_drafter("ngram").draft_per_token_s < 0.1) == warm


def test_each_kind_of_drafter_keeps_its_own_drafting_cost_over_one_verify_curve():
    costs = flat_costs()
    eagle, ngram = costs.for_drafter("eagle"), costs.for_drafter("ngram")
    assert costs.for_drafter("eagle") is eagle
    eagle.observe_draft(4, 0.02)
    assert eagle.draft_s(1) == 0.005 and ngram.draft_s(1) == 0.0
    ngram.observe_verify(8, 0.026, weight=1.0)
    assert eagle.verify_s(8) == costs.verify_s(8) == 0.026


def test_a_batch_gives_drafts_to_the_drafter_whose_drafts_are_cheap():
    """Two sequences with the same acceptance in one pass: the one with costly drafts gets fewer."""
    from specdec.policy import plan_lengths

    costs = flat_costs()
    costly, cheap = costs.for_drafter("slow"), costs.for_drafter("fast")
    costly.observe_draft(1, 0.004)
    policies = [DraftLengthPolicy(8, costly), DraftLengthPolicy(8, cheap)]
    for p in policies:
        for _ in range(30):
            p.observe(8, 5)
    slow_k, fast_k = plan_lengths(policies, costs, [8, 8]).commit()
    assert fast_k > slow_k


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


def test_a_probe_that_pays_alone_is_skipped_in_a_compute_bound_batch():
    """After a pause, a request drafts a probe when alone, but not in a pass over 16 sequences whose verify cost
    grows with every token (a CPU without AMX): there the probe waits for another pause, not doubled."""
    from specdec.policy import PROBE_LENGTH, plan_lengths

    costs = CostModel({1: 0.010, 2: 0.0105, 4: 0.011, 8: 0.016, 16: 0.024, 32: 0.045})
    costs.observe_draft(1, 0.002)
    for batch, probed in ((1, True), (16, False)):
        policies = [DraftLengthPolicy(8, costs) for _ in range(batch)]
        for policy in policies:
            for _ in range(20):
                policy.observe(2, 0)
            policy.pause()
        cooldown = policies[0].paused
        ks = [plan_lengths(policies, costs, [8] * batch).commit()
              for _ in range(cooldown + 1)]  # the pause, then the probe
        assert (ks[-1][0] == PROBE_LENGTH) == probed, ks[-1]
        if not probed:
            assert ks[-1] == [0] * batch and policies[0].paused == policies[0].next_cooldown == 2 * cooldown


def test_drafts_made_in_shared_passes_are_charged_what_a_row_adds():
    """Four greedy requests the 4-bit copy drafts for in shared passes (a pass over 4 rows costing 1.4 one-row
    passes, as measured on a Zen 4): charged a whole pass per draft, drafting would not pay in the batch's compute-
    bound verify pass; charged what each row adds, it does. A copy whose passes cost as much per row as passes
    apart (ratio n) is charged as before."""
    from specdec.costs import SharedPasses
    from specdec.policy import plan_lengths

    costs = CostModel({1: 0.010, 4: 0.011, 8: 0.014, 16: 0.026, 32: 0.050})
    copy_costs = costs.for_drafter("quantized")
    copy_costs.observe_draft(1, 0.0042)

    def ready(batch: int) -> list[DraftLengthPolicy]:
        policies = [DraftLengthPolicy(8, copy_costs) for _ in range(batch)]
        for policy in policies:
            for _ in range(30):
                policy.observe(5, 5)
        return policies

    shared = SharedPasses({1: 0.0042, 2: 0.0044, 4: 0.0058, 8: 0.0106, 16: 0.020})
    apart = SharedPasses({1: 0.0042, 2: 0.0084, 4: 0.0168, 8: 0.0336, 16: 0.0672})
    assert plan_lengths(ready(4), costs, [8] * 4).commit() == [0] * 4
    assert plan_lengths(ready(4), costs, [8] * 4, [apart] * 4).commit() == [0] * 4
    lengths = plan_lengths(ready(4), costs, [8] * 4, [shared] * 4).commit()
    assert min(lengths) > 0 and max(lengths) - min(lengths) <= 1, lengths
    # alone there is nothing to share: the same length either way
    assert plan_lengths(ready(1), costs, [8], [shared]).commit() == plan_lengths(ready(1), costs, [8]).commit()


def test_planning_lengths_changes_no_policy_until_the_plan_is_committed():
    """plan_lengths and plan_alone are questions: asked any number of times they give the same plan and leave every
    policy as it was (a pause, a probe, a miss, estimates); commit() then takes the step."""
    import copy

    from specdec.policy import plan_lengths

    costs = flat_costs()
    waiting, probing, missing, drafting = (DraftLengthPolicy(6, costs) for _ in range(4))
    waiting.pause()
    waiting.paused = 1  # its pause ends with this step
    probing.probing = True
    for _ in range(30):
        missing.observe(6, 0)
    for _ in range(5):
        drafting.observe(6, 6)
    policies = [waiting, probing, missing, drafting]

    def state(policy: DraftLengthPolicy) -> dict:  # all but the shared cost model it reads
        return copy.deepcopy({k: v for k, v in vars(policy).items() if k not in ("costs", "memory")})

    before = [state(p) for p in policies]
    plans = [plan_lengths(policies, costs, [6] * 4) for _ in range(3)]
    alone = [plan_alone(waiting, costs, 6, sizing="tree") for _ in range(3)]
    assert [state(p) for p in policies] == before
    assert all(p.lengths == plans[0].lengths and p.turns == plans[0].turns for p in plans)
    assert plans[0].turns == ["wait", "probe", "pause", "draft"] and alone[0].lengths == alone[2].lengths == [0]
    assert plans[0].commit() == plans[0].lengths
    assert waiting.paused == 0 and not probing.probing and missing.paused > 0
