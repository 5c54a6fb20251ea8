"""What the draft-length policy reads: the measured cost of a target pass by tokens scored (the verify curve) and
each kind of drafter's cost and acceptance, kept across the requests an engine serves."""

from __future__ import annotations

import bisect
import copy
import time

import torch


class CostModel:
    """Seconds per target forward by tokens scored (verify(T)), and seconds per drafted token.

    A pass over one sequence and a pass over S sequences with the same T tokens in all cost differently (each
    sequence's attention reads its own cache; a server's batch holds longer contexts than the curve measured at
    load), so passes over several sequences are kept apart, by S: a batch's draft lengths are planned against the
    passes its size was seen to take, and one sequence's against its own curve, which no batch moves."""

    def __init__(self, verify_table: dict[int, float] | None = None, draft_per_token_s: float = 0.0):
        # Without measurements assume T tokens cost 1 + 0.03 (T - 1) single-token forwards.
        self.measured = bool(verify_table)
        self.table = dict(verify_table or {1: 1.0, 64: 1.0 + 0.03 * 63})
        self._curve: dict = {}  # the table made non-decreasing ("points": sorted (T, seconds)), and values read
        # from it by T; emptied on change
        # passes over S > 1 sequences, by S: {T: seconds}, T the tokens of all of them (a batch's verify passes)
        self.batch_tables: dict[int, dict[int, float]] = {}
        self._batch_curves: dict[int, list[tuple[int, float]]] = {}  # each table made non-decreasing; emptied on change
        self.draft_per_token_s = draft_per_token_s
        self.cheapest_draft_s = draft_per_token_s  # the lowest per-token drafting cost measured
        self._drafted = False
        self._views: dict[str, CostModel] = {}
        self.memory = AcceptanceMemory()

    def for_drafter(self, name: str) -> "CostModel":
        """The view of one kind of drafter: the same verify curve (one table, which every pass updates) with
        that drafter's own drafting cost, so that drafters serving side by side do not mix their costs."""
        if name not in self._views:
            view = copy.copy(self)  # shares the verify tables, their curves and `_views`; drafting figures are its own
            view.memory = AcceptanceMemory()  # and so is what its drafts were accepted at
            self._views[name] = view
        return self._views[name]

    def verify_s(self, T: int, sequences: int = 1) -> float:
        """Seconds for a pass over T tokens of `sequences` sequences. One sequence: the measured table, made
        non-decreasing in T (a pass over more tokens never costs less; a noisy spell at one size would otherwise
        make its neighbours look cheap or dear), and interpolated linearly between sizes (extrapolated from the last
        two past the largest). Several: the passes seen over that many sequences, read the same way between the
        sizes seen; past them, the nearest seen plus what the one-sequence curve adds between the two sizes (the
        extra rows' products); none seen yet, the one-sequence curve."""
        if sequences > 1 and self.batch_tables.get(sequences):
            return self._batch_verify_s(T, sequences)
        if not self._curve:
            self._curve["points"] = non_decreasing(sorted(self.table.items()))
        seconds = self._curve.get(T)  # the policy asks for the same sizes many times a step
        if seconds is None:
            seconds = self._curve[T] = interpolate(self._curve["points"], T)
        return seconds

    def _batch_verify_s(self, T: int, sequences: int) -> float:
        points = self._batch_curves.get(sequences)
        if points is None:
            points = self._batch_curves[sequences] = non_decreasing(sorted(self.batch_tables[sequences].items()))
        (first, at_first), (last, at_last) = points[0], points[-1]
        if T > last:
            return at_last + max(0.0, self.verify_s(T) - self.verify_s(last))
        if T < first:
            return max(at_first - max(0.0, self.verify_s(first) - self.verify_s(T)), 1e-9)
        return interpolate(points, T)

    def _curve_changed(self, sequences: int) -> None:
        """Drops the curve of the table that moved (shared with every view, so theirs is rebuilt too); a batch's
        curve reads one sequence's live, so it outlives that curve's changes."""
        if sequences <= 1:
            self._curve.clear()
        else:
            self._batch_curves.pop(sequences, None)

    def draft_s(self, k: int, cheapest: bool = False) -> float:
        """Seconds to draft k positions (a tree's cost is counted per level); cheapest: at the lowest cost measured."""
        return k * (self.cheapest_draft_s if cheapest else self.draft_per_token_s)

    def reset_draft(self) -> None:
        """Forgets the drafting cost (after a warm-up, whose first calls pay for allocations)."""
        self.draft_per_token_s, self.cheapest_draft_s, self._drafted = 0.0, 0.0, False

    def observe_verify(self, T: int, seconds: float, weight: float = 0.1, sequences: int = 1) -> None:
        """Moves the cost of a pass over T tokens of `sequences` sequences towards `seconds`. A size seen for the
        first time starts from the estimate there (verify_s), so one slow pass does not set it alone."""
        table = self.table if sequences <= 1 else self.batch_tables.setdefault(sequences, {})
        old = table.get(T)
        if old is None and self.measured:
            old = self.verify_s(T, sequences)
        table[T] = seconds if old is None else (1 - weight) * old + weight * seconds
        self._curve_changed(sequences)

    def observe_draft(self, k: int, seconds: float, weight: float = 0.2) -> None:
        if k <= 0:
            return
        per = seconds / k
        self.draft_per_token_s = per if not self._drafted else (1 - weight) * self.draft_per_token_s + weight * per
        self.cheapest_draft_s = per if not self._drafted else min(self.cheapest_draft_s, per)
        self._drafted = True


class SharedPasses:
    """A drafter whose passes serve several sequences at once (the 4-bit copy, a draft model or a head drafting for
    a batch): its seconds per pass by rows fed (measured at load, moved by every pass; read as the verify curve is:
    non-decreasing, interpolated), so that the policy charges a sequence's draft what one more row adds to a shared
    pass."""

    def __init__(self, table: dict[int, float]):
        self.table = dict(table)  # {rows fed: seconds of one pass}
        self._points: list[tuple[int, float]] | None = None  # the table made non-decreasing; None after a change

    def pass_s(self, rows: int) -> float:
        """Seconds of one pass over `rows` rows."""
        if self._points is None:
            self._points = non_decreasing(sorted(self.table.items()))
        return interpolate(self._points, rows)

    def ratio(self, rows: int) -> float:
        """A pass over `rows` rows against a pass over one (0 for none)."""
        return self.pass_s(rows) / self.pass_s(1) if rows > 0 else 0.0

    def observe(self, rows: int, seconds: float, weight: float = 0.1) -> None:
        """Moves the time of a pass over `rows` rows towards `seconds` (a size seen first starts from the curve)."""
        old = self.table.get(rows)
        self.table[rows] = (1 - weight) * (self.pass_s(rows) if old is None else old) + weight * seconds
        self._points = None


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
    if T <= points[0][0]:
        return points[0][1]
    j = min(max(bisect.bisect_left(points, (T,)), 1), len(points) - 1)  # the segment (j - 1, j) holding T
    (t0, v0), (t1, v1) = points[j - 1], points[j]
    value = v0 + (v1 - v0) * (T - t0) / (t1 - t0)
    if T < t1:  # within the segment: never past its ends (rounding can put it an ulp below v0)
        value = min(max(value, v0), v1)
    return max(value, 1e-9)


def fade_position_counts(
    tried: list[float], accepted: list[float], reached: int, kept: int, decay: float
) -> tuple[list[float], list[float]]:
    """Per-position counts after a step that reached its first `reached` positions and kept its first `kept`
    drafts: earlier counts fade by `decay`, then each reached position counts one try, and a kept one an acceptance."""
    tried = [t * decay + (i < reached) for i, t in enumerate(tried)]
    accepted = [a * decay + (i < min(kept, reached)) for i, a in enumerate(accepted)]
    return tried, accepted


class AcceptanceMemory:
    """What one kind of drafter's drafts were accepted at, per position, over the requests it served (counts that
    fade slowly): a new request's policy starts from it, worth a few steps of evidence, instead of from the flat
    prior, so that one early miss does not switch drafting off for a pause where the drafter usually pays."""

    START_WEIGHT = 4.0  # steps of evidence a new request's estimates start with, at most
    DECAY = 0.99

    def __init__(self):
        self.tried: list[float] = []
        self.accepted: list[float] = []

    def observe(self, drafted: int, accepted: int, positions: int | None = None) -> None:
        """A step where `accepted` of `drafted` drafts were kept, `positions` deep (a tree's levels; a chain's
        length by default). Positions past the first rejection are not counted as tried: the estimates are
        conditional on reaching them."""
        reached = min(accepted + 1, positions or drafted)
        if len(self.tried) < reached:
            grow = reached - len(self.tried)
            self.tried += [0.0] * grow
            self.accepted += [0.0] * grow
        self.tried, self.accepted = fade_position_counts(self.tried, self.accepted, reached, accepted, self.DECAY)

    def start(self, k_max: int) -> tuple[list[float], list[float]]:
        """(tried, accepted) for a new policy's first k_max positions, scaled to at most START_WEIGHT steps."""
        if not self.tried or self.tried[0] <= 0:
            return [0.0] * k_max, [0.0] * k_max
        scale = min(1.0, self.START_WEIGHT / self.tried[0])
        pad = [0.0] * max(0, k_max - len(self.tried))
        return ([t * scale for t in self.tried[:k_max]] + pad, [a * scale for a in self.accepted[:k_max]] + pad)


def time_by_size(run, reset, sizes, repeats: int = 3, clock=time.perf_counter) -> dict[int, float]:
    """{size: the least seconds of `repeats` timed calls run(size)}, reset(size) after each call, untimed.

    Every size runs once untimed first, and the first timed round is dropped too: a process's first passes at a
    size run slower (measured: up to 1.6x at 8-16 tokens), and a curve that kept them made drafting look dear in
    every batch. The sizes take turns, one call each a round, so that a slow spell of a shared machine falls on all of
    them; and since other work only ever adds time, the least time of each is its pass's own cost."""
    for size in sizes:
        run(size)
        reset(size)
    times: dict[int, list[float]] = {size: [] for size in sizes}
    for _ in range(repeats + 1):
        for size in sizes:
            start = clock()
            run(size)
            times[size].append(clock() - start)
            reset(size)
    return {size: min(measured[1:]) for size, measured in times.items()}


@torch.inference_mode()
def measure_verify_costs(backend, sizes=(1, 2, 4, 8, 16, 32), context: int = 128, repeats: int = 3) -> dict[int, float]:
    """Times one target forward over T new tokens after `context` cached ones: {T: seconds} (time_by_size)."""
    cache = backend.new_cache()
    try:
        vocab = backend.info.vocab_size
        backend.forward(cache, torch.randint(0, vocab, (context,)), last_only=True)
        ids = {T: torch.randint(0, vocab, (T,)) for T in sizes}

        def run(T: int) -> None:
            backend.forward(cache, ids[T]).logits[-1, 0].item()  # .item(): waits for the device

        return time_by_size(run, lambda T: backend.truncate(cache, context), sizes, repeats)
    finally:
        backend.release(cache)
