"""A step's drafts: each request's draft length (DraftLengths, from its policy and the measured costs), then each
running request's drafter proposes up to it (the scheduler's step, before the verify pass), or the tokens its
constraint forces next; drafters that draft several requests in shared passes (propose_together: the target's 4-bit
copy, a draft model, a drafter head on the kernels) do so. Each request's drafting time goes to its metrics and costs.
Shared passes are charged to the policy by what a row adds to them (policy.plan_lengths, costs.SharedPasses)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .costs import CostModel, SharedPasses
from .policy import plan_alone, plan_lengths
from .drafters.base import Budget, DraftJob
from .request import Request
from .verify import Draft


IDLE_RECHECK = 8  # steps at the same batch size before a batch the policy gave no drafts is asked again


@dataclass
class DraftLengths:
    """Each request's draft length a step, for the steps where some request has a drafter. Above the engine's
    SpeculationConfig.max_batch_for_drafting requests nothing drafts (nor does any policy probe or count down its
    pause). Alone, a request's policy plans its step (policy.plan_alone); in a batch the policies' lengths are planned
    together (policy.plan_lengths), and a batch they gave no drafts is asked again only after IDLE_RECHECK steps at
    the same size: in large batches, where drafts do not pay, asking every step cost about 1% of the step."""

    costs: CostModel
    limit: int | None = None  # the engine's SpeculationConfig.max_batch_for_drafting, not a request's own
    idle: tuple[int, int] = (0, 0)  # (batch size, steps left) after a batched step the policies gave no drafts

    def plan(self, requests: list[Request], solo: bool) -> list[int]:
        """The draft lengths of this step's requests (in order; some of them with a drafter), committed: each policy
        takes its step."""
        if self.limit is not None and len(requests) > self.limit:
            return [0] * len(requests)
        if solo:
            r = requests[0]
            assert r.drafter is not None and r.policy is not None  # the one request has a drafter (above)
            return plan_alone(r.policy, self.costs, r.draft_cap(), r.drafter.sizing).commit()
        size, left = self.idle
        if size == len(requests) and left > 0:
            self.idle = (size, left - 1)
            return [0] * len(requests)
        caps = [r.draft_cap() for r in requests]
        plan = plan_lengths([r.policy for r in requests], self.costs, caps, [shared_passes(r) for r in requests])
        lengths = plan.commit()
        # idle only where drafts were possible and did not pay: a batch whose requests are at their last token
        # (no room for a draft) says nothing of the next batch of its size
        self.idle = (len(requests), 0 if any(lengths) or not any(caps) else IDLE_RECHECK)
        return lengths


def propose_all(requests: list[Request], lengths: list[int], solo: bool) -> list[Draft]:
    """Each request's draft, of at most lengths[i] positions (a tree only when `solo`). Requests whose drafters
    share a copy (propose_together) and that force no tokens draft together, each charged an equal share of the
    time."""
    groups: dict = {}  # id(passes) -> (passes, members)
    for i, (r, k) in enumerate(zip(requests, lengths)):
        if k > 0 and (passes := shared_passes(r)) is not None:
            groups.setdefault(id(passes), (passes, []))[1].append(i)
    drafts = {}
    for passes, members in (g for g in groups.values() if len(g[1]) > 1):
        t0 = time.perf_counter()
        made = requests[members[0]].drafter.propose_together(
            [DraftJob(requests[i].drafter, requests[i].tokens, lengths[i]) for i in members]
        )
        seconds = time.perf_counter() - t0
        # each is charged an equal share, and its cost model learns what drafting alone would have cost it
        alone = seconds / passes.ratio(len(members))
        drafts.update({i: charge(requests[i], draft, seconds / len(members), alone) for i, draft in zip(members, made)})
    return [
        drafts[i] if i in drafts else propose(r, Budget(k, tree=solo))
        for i, (r, k) in enumerate(zip(requests, lengths))
    ]


def shared_passes(request: Request) -> SharedPasses | None:
    """The passes a request's drafts share with other requests' (a 4-bit copy, draft model or head drafting for
    greedy requests that no constraint steers), or None where it drafts alone."""
    drafter = request.drafter
    return drafter.pass_sharing() if drafter is not None and request.logits_processor is None else None


def propose(request: Request, budget: Budget) -> Draft:
    """Up to budget.k drafts for the request: the tokens its constraint forces next, else its drafter's."""
    if budget.k <= 0:
        return Draft.empty()
    if request.logits_processor is not None and (forced := request.logits_processor.forced(budget.k)):
        return Draft(tokens=torch.tensor(forced, dtype=torch.long))  # the text the constraint forces next
    assert request.drafter is not None  # only a request with a drafter is given drafts
    t0 = time.perf_counter()
    draft = request.drafter.propose(request.tokens, budget)
    return charge(request, draft, time.perf_counter() - t0)


def charge(request: Request, draft: Draft, seconds: float, alone: float | None = None) -> Draft:
    """The draft cut to the context's room (the verify pass caches every draft for a moment: a tree larger than the
    room is cut to fit), its drafting time counted in the request's metrics, and in its costs as what drafting
    alone took or would have taken (`alone`, for drafts made in passes shared with other requests)."""
    draft = draft.head(request.max_context - len(request.tokens))
    request.metrics.draft_time_s += seconds
    assert request.costs is not None  # a request with a drafter has its kind's costs
    request.costs.observe_draft(draft.positions, seconds if alone is None else alone)
    return draft
