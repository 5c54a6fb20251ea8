"""Draft lengths planned for the sequences of one shared verify pass: drafts go to the drafter whose drafts are
cheap, a probe that pays alone waits in a compute-bound batch, drafts made in shared passes are charged what a row
adds, and planning changes no policy until the plan is committed."""
from specdec.costs import CostModel
from specdec.policy import DraftLengthPolicy, plan_alone
from cost_curves import flat_costs


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

    costs = CostModel({1: 0.010, 4: 0.011, 8: 0.012, 16: 0.026, 32: 0.050})
    copy_costs = costs.for_drafter("quantized")
    copy_costs.observe_draft(1, 0.0042)

    def ready(batch: int) -> list[DraftLengthPolicy]:
        return _always_right(batch, 8, copy_costs, drafted=5)

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


def test_a_batch_drafts_only_where_the_curve_promises_the_margin(monkeypatch):
    """Four requests whose drafts are nearly always right, drafting for free, over a verify curve where one draft
    each (8 rows) gives 4-5% more tokens a second than the 4-row pass: below BATCH_MARGIN, the batch drafts nothing;
    without the margin it would draft. Alone, where a second row costs 5% more, the same estimates draft."""
    import specdec.policy as policy_module
    from specdec.policy import BATCH_MARGIN, plan_lengths

    costs = CostModel({1: 0.010, 2: 0.0105, 4: 0.011, 8: 0.021, 16: 0.042})
    lookup_costs = costs.for_drafter("ngram")
    lookup_costs.observe_draft(1, 1e-6)

    def ready(batch: int) -> list[DraftLengthPolicy]:
        return _always_right(batch, 1, lookup_costs, drafted=1)

    assert BATCH_MARGIN >= 0.05
    assert plan_lengths(ready(4), costs, [1] * 4).commit() == [0] * 4
    assert plan_lengths(ready(1), costs, [1]).commit() == [1]
    monkeypatch.setattr(policy_module, "BATCH_MARGIN", 0.0)
    assert sum(plan_lengths(ready(4), costs, [1] * 4).commit()) > 0


def _always_right(batch: int, k_max: int, costs, drafted: int) -> list[DraftLengthPolicy]:
    """`batch` policies that saw 30 steps of `drafted` drafts all accepted."""
    policies = [DraftLengthPolicy(k_max, costs) for _ in range(batch)]
    for policy in policies:
        for _ in range(30):
            policy.observe(drafted, drafted)
    return policies


def test_a_batch_plans_against_the_passes_its_size_was_seen_to_take():
    """Four sequences whose drafts are accepted half the time: on one sequence's curve (measured at load, short
    contexts) their drafted rows look nearly free and they draft; once passes over four sequences were seen to grow
    by 6 ms a drafted row (long caches, each row's attention), the same batch drafts nothing, and one sequence alone
    still plans on its own curve."""
    from specdec.policy import plan_lengths

    costs = flat_costs()

    def drafts(sequences: int) -> bool:
        policies = [DraftLengthPolicy(8, costs) for _ in range(sequences)]
        for policy in policies:
            for step in range(30):
                policy.observe(1, step % 2)
        return any(plan_lengths(policies, costs, [8] * sequences).lengths)

    assert drafts(4) and drafts(1)
    for T in range(4, 13):
        costs.observe_verify(T, 0.040 + 0.006 * (T - 4), weight=1.0, sequences=4)
    assert not drafts(4) and drafts(1)
