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
noisy verify curve, and each failed probe costs a whole step.
"""
from __future__ import annotations

import copy
import time

import torch


PROBE_LENGTH = 2  # drafts of a probe after a pause (a tree drafter sizes its own tree)
PROBE_MARGIN = 0.1  # a probe must promise 10% more tokens per second than plain decoding, at the prior


class CostModel:
    """Seconds per target forward by tokens scored (verify(T)), and seconds per drafted token."""

    def __init__(self, verify_table: dict[int, float] | None = None, draft_per_token_s: float = 0.0):
        # Without measurements assume T tokens cost 1 + 0.03 (T - 1) single-token forwards.
        self.measured = bool(verify_table)
        self.table = dict(verify_table or {1: 1.0, 64: 1.0 + 0.03 * 63})
        self._curve: dict = {}  # the table made non-decreasing, as sorted (T, seconds) points; emptied on change
        self.draft_per_token_s = draft_per_token_s
        self.cheapest_draft_s = draft_per_token_s  # the lowest per-token drafting cost measured
        self._drafted = False
        self._views: dict[str, CostModel] = {}
        self.memory = AcceptanceMemory()

    def for_drafter(self, name: str) -> "CostModel":
        """The view of one kind of drafter: the same verify curve (one table, which every pass updates) with
        that drafter's own drafting cost, so that drafters serving side by side do not mix their costs."""
        if name not in self._views:
            view = copy.copy(self)  # shares `table`, `_curve` and `_views`; drafting figures are its own
            view.memory = AcceptanceMemory()  # and so is what its drafts were accepted at
            self._views[name] = view
        return self._views[name]

    def verify_s(self, T: int) -> float:
        """Seconds for a pass over T tokens: the measured table, made non-decreasing in T (a pass over more tokens
        never costs less; a noisy spell at one size would otherwise make its neighbours look cheap or dear), and
        interpolated linearly between sizes (extrapolated from the last two past the largest)."""
        if not self._curve:
            self._curve["points"] = non_decreasing(sorted(self.table.items()))
        return interpolate(self._curve["points"], T)

    def _curve_changed(self) -> None:
        self._curve.clear()  # shared with every view, so theirs is rebuilt too

    def draft_s(self, k: int, cheapest: bool = False) -> float:
        """Seconds to draft k positions (a tree's cost is counted per level); cheapest: at the lowest cost measured."""
        return k * (self.cheapest_draft_s if cheapest else self.draft_per_token_s)

    def reset_draft(self) -> None:
        """Forgets the drafting cost (after a warm-up, whose first calls pay for allocations)."""
        self.draft_per_token_s, self.cheapest_draft_s, self._drafted = 0.0, 0.0, False

    def observe_verify(self, T: int, seconds: float, weight: float = 0.1) -> None:
        """Moves the cost of a pass over T tokens towards `seconds`. A size seen for the first time starts from the
        curve's value there, so one slow pass does not set it alone."""
        old = self.table.get(T)
        if old is None and self.measured:
            old = self.verify_s(T)
        self.table[T] = seconds if old is None else (1 - weight) * old + weight * seconds
        self._curve_changed()

    def observe_draft(self, k: int, seconds: float, weight: float = 0.2) -> None:
        if k <= 0:
            return
        per = seconds / k
        self.draft_per_token_s = per if not self._drafted else (1 - weight) * self.draft_per_token_s + weight * per
        self.cheapest_draft_s = per if not self._drafted else min(self.cheapest_draft_s, per)
        self._drafted = True


def non_decreasing(points: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The closest non-decreasing values (least squares: pool adjacent violators) at the same sizes."""
    blocks: list[list[float]] = []  # [sum, count] of pooled runs
    for _, value in points:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    values = [total / count for total, count in blocks for _ in range(int(count))]
    return [(T, v) for (T, _), v in zip(points, values)]


def interpolate(points: list[tuple[int, float]], T: int) -> float:
    """The piecewise-linear value at T through sorted (size, seconds) points, extended from the last two."""
    if len(points) == 1:
        return points[0][1]
    for (t0, v0), (t1, v1) in zip(points, points[1:]):
        if T <= t1 or (t1, v1) == points[-1]:
            if T <= t0:
                return v0
            return max(v0 + (v1 - v0) * (T - t0) / (t1 - t0), 1e-9)
    return points[-1][1]


class AcceptanceMemory:
    """What one kind of drafter's drafts were accepted at, per position, over the requests it served (counts that
    fade slowly): a new request's policy starts from it, worth a few steps of evidence, instead of from the flat
    prior, so that one early miss does not switch drafting off for a pause where the drafter usually pays."""

    START_WEIGHT = 4.0  # steps of evidence a new request's estimates start with, at most
    DECAY = 0.99

    def __init__(self):
        self.tried: list[float] = []
        self.accepted: list[float] = []

    def observe(self, drafted: int, accepted: int) -> None:
        """A step where `accepted` of `drafted` chained drafts were kept (positions past the first rejection are
        not counted as tried: the estimates are conditional on reaching them)."""
        reached = min(accepted + 1, drafted)
        if len(self.tried) < reached:
            grow = reached - len(self.tried)
            self.tried += [0.0] * grow
            self.accepted += [0.0] * grow
        self.tried = [t * self.DECAY for t in self.tried]
        self.accepted = [a * self.DECAY for a in self.accepted]
        for i in range(reached):
            self.tried[i] += 1.0
            self.accepted[i] += float(i < accepted)

    def start(self, k_max: int) -> tuple[list[float], list[float]]:
        """(tried, accepted) for a new policy's first k_max positions, scaled to at most START_WEIGHT steps."""
        if not self.tried or self.tried[0] <= 0:
            return [0.0] * k_max, [0.0] * k_max
        scale = min(1.0, self.START_WEIGHT / self.tried[0])
        pad = [0.0] * max(0, k_max - len(self.tried))
        return ([t * scale for t in self.tried[:k_max]] + pad, [a * scale for a in self.accepted[:k_max]] + pad)


class DraftLengthPolicy:
    """Per-request choice of k from per-position acceptance and the cost model.

    When no k > 0 pays, speculation pauses for `cooldown` plain steps; each pause that ends in
    another miss doubles the next one (up to max_cooldown), and any accepted draft resets it.
    After a pause half the evidence is forgotten, so estimates move back towards the prior; the next
    step drafts (a probe) when the estimates say it pays, or when drafts would pay at the prior
    acceptance and the cheapest drafting cost measured, so that stale estimates are measured again.
    """

    def __init__(self, k_max: int, costs: CostModel, adaptive: bool = True, prior: float = 0.5,
                 prior_weight: float = 1.0, decay: float = 0.95, cooldown: int = 8, max_cooldown: int = 256):
        self.k_max = k_max
        self.costs = costs
        self.adaptive = adaptive
        self.prior, self.prior_weight, self.decay = prior, prior_weight, decay
        self.memory: AcceptanceMemory | None = getattr(costs, "memory", None)
        self.tried, self.accepted = self.memory.start(k_max) if self.memory else ([0.0] * k_max, [0.0] * k_max)
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

    def choose(self) -> int:
        """k for this sequence scored alone."""
        return choose_lengths([self], self.costs, [self.k_max])[0]

    def ready(self) -> bool:
        """False while speculation is paused (the pause counts down one step per call)."""
        if self.paused > 0:
            self.paused -= 1
            if self.paused == 0:
                self.tried = [t * 0.5 for t in self.tried]
                self.accepted = [a * 0.5 for a in self.accepted]
                self.probing = self.best_k([self.prior] * self.k_max, cheapest=True, margin=PROBE_MARGIN) > 0
            return False
        return True

    def pause(self) -> None:
        self.paused = self.next_cooldown
        self.next_cooldown = min(2 * self.next_cooldown, self.max_cooldown)

    def observe(self, drafted: int, accepted: int) -> None:
        """Records a step where `accepted` of `drafted` tokens were kept; steps without drafts teach nothing."""
        if drafted == 0:
            return
        if self.memory is not None:
            self.memory.observe(drafted, accepted)
        self.tried = [t * self.decay for t in self.tried]
        self.accepted = [a * self.decay for a in self.accepted]
        for i in range(min(accepted + 1, drafted, self.k_max)):
            self.tried[i] += 1.0
            if i < accepted:
                self.accepted[i] += 1.0
        if accepted > 0:
            self.next_cooldown = self.first_cooldown


def choose_lengths(policies: list[DraftLengthPolicy | None], costs: CostModel, caps: list[int]) -> list[int]:
    """Draft lengths for sequences scored in one target pass (verify costs from `costs`, each sequence's
    drafting cost from its policy's), maximising expected tokens per second. A sequence without a policy (no
    drafter) drafts nothing, but its token counts in the pass.

    Every sequence emits at least one token; giving sequence i its next draft token adds the chance
    that all its drafts up to there are accepted, and costs one more token in the shared pass plus the
    drafting. Draft tokens go, one at a time, where that chance is highest; the allocation kept is the
    best prefix of that order. With many sequences the pass is compute-bound, so lengths shrink, and
    speculation switches off by itself when it no longer pays. Alone, this is argmax_k E(k) / C(k).
    """
    ks = [0] * len(policies)
    candidates = []
    for i, (policy, cap) in enumerate(zip(policies, caps)):
        cap = min(cap, policy.k_max) if policy is not None else 0
        if cap <= 0:
            continue
        if not policy.adaptive:
            ks[i] = cap
        elif policy.probing:
            policy.probing = False
            ks[i] = min(cap, PROBE_LENGTH)
        elif policy.ready():
            if policy.best_k() == 0:
                policy.pause()
            else:
                candidates.append((i, cap, policy.acceptance()))
    tokens = len(policies) + sum(ks)
    drafting = sum(policy.costs.draft_s(k) for policy, k in zip(policies, ks) if policy is not None)  # its own cost
    expected = float(len(policies))  # + fixed-length sequences' gains, a constant for this choice
    best_rate = expected / (costs.verify_s(tokens) + drafting)
    reach = {i: 1.0 for i, _, _ in candidates}
    given = {i: 0 for i, _, _ in candidates}
    order, best_prefix = [], 0
    while True:
        options = [(reach[i] * acc[given[i]], i) for i, cap, acc in candidates if given[i] < cap]
        if not options:
            break
        gain, i = max(options)
        reach[i] = gain
        given[i] += 1
        expected += gain
        tokens += 1
        drafting += policies[i].costs.draft_s(1)
        order.append(i)
        rate = expected / (costs.verify_s(tokens) + drafting)
        if rate > best_rate:
            best_rate, best_prefix = rate, len(order)
    for i in order[:best_prefix]:
        ks[i] += 1
    return ks


@torch.inference_mode()
def measure_verify_costs(backend, sizes=(1, 2, 4, 8, 16, 32), context: int = 128, repeats: int = 3) -> dict[int, float]:
    """Times one target forward over T new tokens after `context` cached ones: {T: median seconds}."""
    cache = backend.new_cache()
    try:
        vocab = backend.info.vocab_size
        prompt = torch.randint(0, vocab, (context,))
        backend.forward(cache, prompt, last_only=True)
        table = {}
        for T in sizes:
            ids = torch.randint(0, vocab, (T,))
            times = []
            for _ in range(repeats + 1):
                start = time.perf_counter()
                out = backend.forward(cache, ids)
                out.logits[-1, 0].item()  # waits for the device
                times.append(time.perf_counter() - start)
                backend.truncate(cache, context)
            table[T] = sorted(times[1:])[len(times[1:]) // 2]
        return table
    finally:
        backend.release(cache)


def draft_length(policy: DraftLengthPolicy, costs: CostModel, cap: int, sizes_itself: bool = False,
                 decides_itself: bool = False) -> int:
    """k for a sequence verified alone, with at most `cap` drafts. The policy decides whether drafting pays at all
    (pausing when it does not); a drafter that sizes its own tree from the measured costs (sizes_itself) then gets
    the most drafts allowed. One that decides both itself (decides_itself: the select drafter, from its candidates'
    measured speeds) gets the most allowed without asking the policy, unless drafting is fixed (not adaptive)."""
    if decides_itself and sizes_itself and policy.adaptive:
        return cap
    k = choose_lengths([policy], costs, [cap])[0]
    return cap if k > 0 and sizes_itself else k
