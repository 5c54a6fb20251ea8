"""Draft length from measurements: pick k each step to maximise expected tokens per second.

With a_i the chance that draft position i is accepted once all before it were, a step with k drafts
emits E(k) = 1 + a_0 + a_0 a_1 + ... + a_0..a_{k-1} tokens and costs C(k) = verify(k + 1) + draft(k)
seconds. The policy picks argmax_k E(k) / C(k) over 0..k_max; k = 0 is a plain decoding step, so a
drafter that keeps missing is switched off, and retried after a pause that doubles on each miss,
which bounds what a wrong guess can cost. Estimates only change when drafting happens, so for a drafter
that could pay at all (at the prior acceptance and the cheapest cost measured) the retry is a probe that
drafts anyway and measures again: a slow spell or a run of misses would otherwise switch it off for good,
while a drafter that cannot pay here (layer-skip on a model not trained for it) is not probed. A probe
needs a clear expected gain (PROBE_MARGIN): one that only just pays at the prior tips either way on a
noisy verify curve, and each failed probe costs a whole step. In a batch a probe is judged in the pass it would
join: drafts that pay alone can cost more than they find in a pass over many sequences, where the verify pass is
compute-bound.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, replace

from .costs import AcceptanceMemory, CostModel, SharedPasses, fade_position_counts

PROBE_LENGTH = 2  # drafts of a probe after a pause (a tree drafter sizes its own tree)
PROBE_MARGIN = 0.1  # a probe must promise 10% more tokens per second than plain decoding, at the prior
# In a pass over several sequences, drafts must promise this much more than the pass without them: there the drafted
# rows' verification, rollback and drafting outside the measured curves cost a few percent, and a plan that only
# just pays on the curve made the server's steps at 4 sequences 4% slower (docs/experiments/serving-measurements.md)
BATCH_MARGIN = 0.1


class DraftLengthPolicy:
    """Per-request choice of k from per-position acceptance and the cost model.

    When no k > 0 pays, speculation pauses for `cooldown` plain steps; each pause that ends in
    another miss doubles the next one (up to max_cooldown), and any accepted draft resets it.
    After a pause half the evidence is forgotten, so estimates move back towards the prior; the next
    step drafts (a probe) when the estimates say it pays, or when drafts would pay at the prior
    acceptance and the cheapest drafting cost measured, so that stale estimates are measured again.
    """

    def __init__(
        self,
        k_max: int,
        costs: CostModel,
        adaptive: bool = True,
        prior: float = 0.5,
        prior_weight: float = 1.0,
        decay: float = 0.95,
        cooldown: int = 8,
        max_cooldown: int = 256,
    ):
        self.k_max = k_max
        self.costs = costs
        self.adaptive = adaptive
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.memory: AcceptanceMemory = costs.memory  # what this kind of drafter was accepted at before
        self.tried, self.accepted = self.memory.start(k_max)
        self.first_cooldown, self.max_cooldown = cooldown, max_cooldown
        self.next_cooldown = cooldown
        self.paused = 0
        self.probing = False  # the next step drafts to measure the drafting cost again

    def acceptance(self) -> list[float]:
        """a_i for i < k_max, smoothed towards a_{i-1} (towards the prior for i = 0)."""
        out, base = [], self.prior
        for a, t in zip(self.accepted, self.tried):
            base = (a + self.prior_weight * base) / (t + self.prior_weight)
            out.append(base)
        return out

    def best_k(self, acceptance: list[float] | None = None, cheapest: bool = False, margin: float = 0.0) -> int:
        """argmax_k E(k) / C(k) for the current estimates, or for `acceptance`; cheapest: at the lowest drafting
        cost measured; margin: k > 0 must beat plain decoding's rate by this fraction."""
        best_k, best_rate = 0, (1.0 + margin) / self.costs.verify_s(1)
        expected, reach = 1.0, 1.0
        for k, a in enumerate(acceptance or self.acceptance(), start=1):
            reach *= a
            expected += reach
            rate = expected / (self.costs.verify_s(k + 1) + self.costs.draft_s(k, cheapest))
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def step(self) -> int:
        """Takes one step for this sequence scored alone: its k, the step committed (plan_lengths)."""
        return plan_lengths([self], self.costs, [self.k_max]).commit()[0]

    def turn(self, sequences: int, cap: int) -> str:
        """What the next step is for this policy, in a pass over `sequences` sequences (a question: nothing changes
        until take_turn): "fixed" (not adaptive: the cap), "probe" (drafts to measure again), "defer" (a probe that
        would not pay in this pass), "wait" (a pause counting down), "pause" (no k pays: a pause starts), or
        "draft" (a length from the estimates, allocated with the pass's other sequences)."""
        if not self.adaptive:
            return "fixed"
        if self.probing:  # alone, the end of the pause judged it; in a batch, judge it in this pass
            return "probe" if sequences == 1 or self.probe_pays(sequences, min(cap, PROBE_LENGTH)) else "defer"
        if self.paused > 0:
            return "wait"
        return "draft" if self.best_k(self.acceptance()) > 0 else "pause"

    def take_turn(self, turn: str) -> None:
        """Commits a step that turn() said is `turn`: a probe is spent or deferred, a pause counts down (the step
        that ends it forgets half the evidence and decides whether the next step probes), a miss pauses."""
        if turn in ("probe", "defer"):
            self.probing = False
            if turn == "defer":
                self.defer()
        elif turn == "wait":
            self.paused -= 1
            if self.paused == 0:
                self.tried = [t * 0.5 for t in self.tried]
                self.accepted = [a * 0.5 for a in self.accepted]
                self.probing = self.best_k([self.prior] * self.k_max, cheapest=True, margin=PROBE_MARGIN) > 0
        elif turn == "pause":
            self.pause()

    def pause(self) -> None:
        self.paused = self.next_cooldown
        self.next_cooldown = min(2 * self.next_cooldown, self.max_cooldown)

    def defer(self) -> None:
        """Skips a probe that would not pay in this step's pass: another pause, as long as the next one was to
        be and not doubling it, since nothing was measured."""
        self.paused = self.next_cooldown

    def probe_pays(self, sequences: int, length: int) -> bool:
        """Whether `length` drafts for one of `sequences` sequences verified together would raise the pass's
        tokens per second by PROBE_MARGIN, at the prior acceptance and the cheapest drafting cost measured."""
        gain = sum(self.prior**j for j in range(1, length + 1))
        plain = self.costs.verify_s(sequences, sequences)
        drafted = self.costs.verify_s(sequences + length, sequences) + self.costs.draft_s(length, True)
        return (sequences + gain) / drafted > (1.0 + PROBE_MARGIN) * sequences / plain

    def observe(self, drafted: int, accepted: int, positions: int | None = None) -> None:
        """Records a step where `accepted` of `drafted` tokens were kept, `positions` deep (a tree's levels; a
        chain's length by default); steps without drafts teach nothing."""
        if drafted == 0:
            return
        positions = positions or drafted
        if self.memory is not None:
            self.memory.observe(drafted, accepted, positions)
        reached = min(accepted + 1, positions, self.k_max)
        self.tried, self.accepted = fade_position_counts(self.tried, self.accepted, reached, accepted, self.decay)
        if accepted > 0:
            self.next_cooldown = self.first_cooldown


@dataclass
class LengthPlan:
    """A step's draft lengths, and what the step is for each policy (DraftLengthPolicy.turn; None: not asked), which
    commit() applies: the owner of the step commits the plan it runs."""

    lengths: list[int]
    policies: list[DraftLengthPolicy | None]
    turns: list[str | None]

    def commit(self) -> list[int]:
        """Applies each policy's turn (a pause counts down, a probe is spent or deferred, a miss pauses); returns
        the lengths. Once per step that runs the plan."""
        for policy, turn in zip(self.policies, self.turns):
            if policy is not None and turn is not None:
                policy.take_turn(turn)
        return self.lengths


def plan_lengths(
    policies: list[DraftLengthPolicy | None],
    costs: CostModel,
    caps: list[int],
    shared: list[SharedPasses | None] | None = None,
) -> LengthPlan:
    """Draft lengths for sequences scored in one target pass (verify costs from `costs` for passes over that many
    sequences, each sequence's drafting cost from its policy's), maximising expected tokens per second. A sequence
    without a policy (no drafter) drafts nothing, but its token counts in the pass. shared[i]: the drafting passes
    sequence i shares with the others of its group (the same 4-bit copy, draft model or head drafting for several
    greedy requests): its j-th draft then costs its solo cost per draft times what one more row adds to the group's
    j-th pass, not a pass of its own.

    Every sequence emits at least one token; giving sequence i its next draft token adds the chance
    that all its drafts up to there are accepted, and costs one more token in the shared pass plus the
    drafting. Draft tokens go, one at a time, where that chance is highest; the allocation kept is the
    best prefix of that order. With many sequences the pass is compute-bound, so lengths shrink, and
    speculation switches off by itself when it no longer pays; with more than one sequence an allocation must beat
    the pass without drafts by BATCH_MARGIN. Alone, this is argmax_k E(k) / C(k).

    A question: no policy changes. The plan's commit() is each policy's step.
    """
    ks = [0] * len(policies)
    turns: list[str | None] = [None] * len(policies)
    candidates = []
    for i, (policy, cap) in enumerate(zip(policies, caps)):
        if policy is None or min(cap, policy.k_max) <= 0:
            continue
        cap = min(cap, policy.k_max)
        turns[i] = turn = policy.turn(len(policies), cap)
        if turn == "fixed":
            ks[i] = cap
        elif turn == "probe":
            ks[i] = min(cap, PROBE_LENGTH)
        elif turn == "draft":
            candidates.append((i, cap, policy.acceptance()))
    shared = shared or [None] * len(policies)
    widths: dict[int, list[int]] = {}  # group -> how many of its sequences draft at each depth so far

    def added_cost(i: int, depth: int) -> float:
        """What sequence i's draft at `depth` (0-based) adds to the step's drafting time."""
        policy, passes = policies[i], shared[i]
        assert policy is not None  # only sequences with a policy draft
        per_draft = policy.costs.draft_s(1)
        if passes is None:
            return per_draft
        width = widths.setdefault(id(passes), [])
        width.extend([0] * (depth + 1 - len(width)))
        width[depth] += 1
        return per_draft * (passes.ratio(width[depth]) - passes.ratio(width[depth] - 1))

    sequences = len(policies)  # the pass's cost by its size: a batch's is not one sequence's (costs.CostModel)
    tokens = sequences + sum(ks)
    drafting = sum(added_cost(i, depth) for i, k in enumerate(ks) for depth in range(k))  # fixed-length ones
    expected = float(sequences)  # + fixed-length sequences' gains, a constant for this choice
    margin = 1.0 + BATCH_MARGIN if sequences > 1 else 1.0
    best_rate = expected / (costs.verify_s(tokens, sequences) + drafting) * margin
    # each candidate's next draft token, by its gain (the likeliest first; on a tie, the later sequence)
    options = [(-acc[0], -i, 0) for i, _, acc in candidates]
    heapq.heapify(options)
    caps_of = {i: (cap, acc) for i, cap, acc in candidates}
    order, best_prefix = [], 0
    while options:
        negative_gain, negative_i, given = heapq.heappop(options)
        i, gain = -negative_i, -negative_gain
        cap, acc = caps_of[i]
        if given + 1 < cap:
            heapq.heappush(options, (-gain * acc[given + 1], negative_i, given + 1))
        expected += gain
        tokens += 1
        drafting += added_cost(i, given)
        order.append(i)
        rate = expected / (costs.verify_s(tokens, sequences) + drafting)
        if rate > best_rate:
            best_rate, best_prefix = rate, len(order)
    for i in order[:best_prefix]:
        ks[i] += 1
    return LengthPlan(ks, list(policies), turns)


def plan_alone(policy: DraftLengthPolicy, costs: CostModel, cap: int, sizing: str = "policy") -> LengthPlan:
    """The plan for a sequence verified alone, with at most `cap` drafts, for a drafter of that sizing
    (Drafter.sizing). The policy decides whether drafting pays at all (pausing when it does not); a drafter that
    sizes its own tree from the measured costs ("tree") then gets the most drafts allowed. One that decides both
    itself ("drafter": select, lookahead) gets the most allowed without asking the policy, unless drafting is fixed
    (not adaptive). A question, as plan_lengths."""
    if sizing == "drafter" and policy.adaptive:
        return LengthPlan([cap], [policy], [None])
    plan = plan_lengths([policy], costs, [cap])
    return replace(plan, lengths=[cap]) if plan.lengths[0] > 0 and sizing != "policy" else plan
