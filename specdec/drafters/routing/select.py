"""Choosing the drafter by predicted speed, step by step: each step drafts with the candidate expected to give the
most tokens per second, or with none where plain decoding is expected to be faster.

For each candidate the selector keeps decayed sums of what its steps yield: tokens emitted (accepted + 1) and
seconds (the verify-cost curve at the draft's size, plus the candidate's drafting time). How far a draft was
accepted is read afterwards from the tokens the target went on to emit, and that is exact: a drafted token is
accepted if and only if the target emits it there, under greedy decoding and under rejection sampling alike
(the residual a rejected token is resampled from excludes it). So candidates that read only the context (prompt
lookup, suffix) and draft in microseconds also draft "in the shadow" (whenever their previous shadow draft has
been scored), and their estimates stay current without being verified. The others (heads on the target's features)
are measured when chosen; one not chosen is retried after a pause that doubles each time it is retried without
winning.

A request's estimates start from those of the requests the selector (and its forks, in a server) served before:
the drafter is chosen per request by the acceptance predicted from earlier ones, then per step by the request's own.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from ...costs import CostModel
from ...policy import DraftLengthPolicy
from ...errors import ConfigError
from ..base import Budget, Draft, Drafter, DraftRequest, features_in_layout
from ..trees import draft_accepted

RETRY_AFTER = 8  # steps before a head that is not chosen is drafted again; doubles while retries do not win
MAX_RETRY = 128
DECAY = 0.9  # weight of a request's older steps in its estimates
PRIOR_STEPS = 2.0  # steps' worth of weight the estimates from earlier requests start a request with
HISTORY_DECAY = 0.8  # weight of older requests in those estimates
POLICY_LENGTH = 16  # positions a chain candidate's own acceptance estimates cover


@dataclass
class Yield:
    """Decayed sums of the tokens a candidate's steps emitted and the seconds they cost."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0

    def add(self, tokens: float, seconds: float, decay: float = DECAY) -> None:
        self.tokens = decay * self.tokens + tokens
        self.seconds = decay * self.seconds + seconds
        self.steps = decay * self.steps + 1.0

    def rate(self) -> float | None:
        """Tokens per second, or None before any step."""
        return self.tokens / self.seconds if self.steps > 0 and self.seconds > 0 else None

    def scaled(self, steps: float) -> "Yield":
        """The same rate carried by at most `steps` steps' worth of weight."""
        f = min(1.0, steps / self.steps) if self.steps > 0 else 0.0
        return Yield(self.tokens * f, self.seconds * f, self.steps * f)


@dataclass
class Pending:
    """A draft (verified, or drafted in the shadow) waiting for the target's tokens that score it."""

    name: str
    start: int  # context length when it was drafted
    tokens: list[int]
    parents: list[int] | None  # a tree's, else None
    size: int  # tokens the step verifies (a shadow chain's prefix a real step would draft)
    draft_s: float

    def accepted(self, context: list[int]) -> int | None:
        """How many of the draft's tokens the target kept, or None while the context does not tell yet."""
        return draft_accepted(self.tokens, self.parents, context[self.start :])


class SelectionHistory:
    """Per-candidate estimates carried from request to request (shared by a selector's forks)."""

    def __init__(self):
        self.yields: dict[str, Yield] = {}

    def record(self, name: str, request: Yield) -> None:
        """Adds one request's estimate of a candidate, as one step's worth (per-step means)."""
        if request.steps <= 0:
            return
        self.yields.setdefault(name, Yield()).add(
            request.tokens / request.steps, request.seconds / request.steps, decay=HISTORY_DECAY
        )

    def prior(self, name: str) -> Yield:
        return self.yields[name].scaled(PRIOR_STEPS) if name in self.yields else Yield()


class SelectingDrafter(Drafter):
    """Drafts each step with whichever candidate drafter is predicted to emit the most tokens per second."""

    name = "select"
    #: where a step allows a tree, the selector takes the most drafts allowed and sizes each candidate's draft
    #: itself (a tree drafter its tree, a chain drafter by its own acceptance), and decides itself whether a step
    #: drafts (from its candidates' measured speeds), instead of the engine's policy, which would judge a mix of
    #: trees and chains as one drafter; in batches k comes from the engine
    sizing = "drafter"

    def __init__(self, candidates: list[Drafter], history: SelectionHistory | None = None):
        if not candidates:
            raise ConfigError("drafter 'select' needs at least one candidate drafter")
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise ConfigError(f"drafter 'select' got the same candidate twice: {', '.join(names)}")
        self.candidates = {c.name: c for c in candidates}
        layouts = [c.feature_layers for c in candidates if c.feature_layers is not None]  # each reader's (observe)
        self.feature_layers = tuple(dict.fromkeys(i for layers in layouts for i in layers)) if layouts else None
        self.needs_scores = any(c.needs_scores for c in candidates)
        self.history = history if history is not None else SelectionHistory()
        self.request: DraftRequest | None = None

    def fork(self) -> "SelectingDrafter":
        return SelectingDrafter([c.fork() for c in self.candidates.values()], self.history)

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        base = request.costs or CostModel()
        self.costs = base
        self.views = {name: base.for_drafter(name) for name in self.candidates}
        for name, candidate in self.candidates.items():
            candidate.begin(dataclasses.replace(request, costs=self.views[name]))
        self.yields = {name: self.history.prior(name) for name in self.candidates}
        self.policies = {name: DraftLengthPolicy(POLICY_LENGTH, self.views[name]) for name in self.candidates}
        self.idle = {name: 0 for name in self.candidates}
        self.retry = {name: RETRY_AFTER for name in self.candidates}
        self.pending: list[Pending] = []

    def end(self) -> None:
        for name, candidate in self.candidates.items():
            candidate.end()
            if self.request is not None:
                self.history.record(name, self.yields[name])
        self.request = None

    def observe(self, features) -> None:
        """features (m, H + A*H) for this drafter's feature_layers: each reader gets those of its own layers."""
        for candidate in self.candidates.values():
            own = candidate.feature_layers
            if own is not None and self.feature_layers is not None:
                candidate.observe(features_in_layout(features, self.feature_layers, own))

    def scored(self, draft: Draft, choices, path: list[int]) -> None:
        """To the candidate that drafted the step, where it reads every row's choice (lookahead)."""
        candidate = self.candidates.get(draft.source) if draft.source is not None else None
        if candidate is not None and candidate.needs_scores:
            candidate.scored(draft, choices, path)

    def learn(self, output: list[int]) -> None:
        for candidate in self.candidates.values():
            candidate.learn(output)

    def shadowed(self, name: str) -> bool:
        """Whether a candidate also drafts in the shadow when not chosen: one that reads only the context (not the
        target's features, nor its choices at the drafted rows)."""
        candidate = self.candidates[name]
        return candidate.feature_layers is None and not candidate.needs_scores

    # ---- a step -----------------------------------------------------------------------------------
    def propose(self, context: list[int], budget: Budget) -> Draft:
        if budget.k <= 0:
            return Draft.empty()
        self._score(context)
        chosen = self._choose()
        draft = Draft.empty()
        for name, candidate in self.candidates.items():
            if name != chosen and not self.shadowed(name):
                self.idle[name] += 1
                continue
            if name != chosen and self._waiting(name):
                continue  # one shadow draft at a time: it is scored before the next is drafted
            length = self._length(name, budget)
            start = time.perf_counter()
            proposal = candidate.propose(context, budget)
            seconds = time.perf_counter() - start
            self.views[name].observe_draft(proposal.positions, seconds)
            size = len(proposal) if proposal.parents is not None else min(length, len(proposal))
            if name == chosen:
                self.idle[name] = 0
                kept = (
                    proposal
                    if size == len(proposal)
                    else Draft(
                        tokens=proposal.tokens[:size], probs=None if proposal.probs is None else proposal.probs[:size]
                    )
                )
                draft = dataclasses.replace(kept, source=name) if len(kept) else Draft.empty()
            if len(proposal):
                self.pending.append(
                    Pending(name, len(context), proposal.tokens.tolist(), proposal.parents, size, seconds)
                )
            else:
                self.yields[name].add(1.0, self.costs.verify_s(1) + seconds)  # a plain step
        return draft

    def _length(self, name: str, budget: Budget) -> int:
        """Drafts a chain candidate's real step would hold: k in batches and for tree drafters, else the length its
        own acceptance and costs favour (0: a plain step)."""
        if not budget.tree or self.candidates[name].sizing != "policy" or not self.current.adaptive:
            return budget.k
        return min(budget.k, self.policies[name].best_k())

    def _choose(self) -> str | None:
        """The candidate to draft with this step, or None (plain decoding is expected to be faster)."""
        fresh = [name for name in self.candidates if self.yields[name].rate() is None and not self._waiting(name)]
        if fresh:
            return fresh[0]
        due = [name for name in self.candidates if not self.shadowed(name) and self.idle[name] >= self.retry[name]]
        best = max(self.candidates, key=lambda name: self.yields[name].rate() or 0.0)
        if due:
            name = due[0]
            self.retry[name] = RETRY_AFTER if name == best else min(2 * self.retry[name], MAX_RETRY)
            return name
        if self.current.adaptive and (self.yields[best].rate() or 0.0) <= 1.0 / self.costs.verify_s(1):
            return None  # plain decoding is expected to be faster (with --no-adaptive every step drafts)
        if not self.shadowed(best):
            self.retry[best] = RETRY_AFTER
        return best

    def _waiting(self, name: str) -> bool:
        """Whether a draft of this candidate awaits scoring (its estimate is on its way)."""
        return any(p.name == name for p in self.pending)

    def _score(self, context: list[int]) -> None:
        """Scores the pending drafts the context now tells about, into their candidates' estimates."""
        still = []
        for p in self.pending:
            accepted = p.accepted(context)
            if accepted is None:
                still.append(p)
                continue
            if p.parents is None:
                self.policies[p.name].observe(len(p.tokens), accepted)
                accepted = min(accepted, p.size)
            self.yields[p.name].add(accepted + 1.0, self.costs.verify_s(p.size + 1) + p.draft_s)
        self.pending = still
