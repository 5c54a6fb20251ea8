"""What-if replay of acceptance traces: what other drafters and draft lengths would have done on logged traffic.

Under greedy decoding the output is the target's whatever the drafter, so a trace's prompt and output token ids
(specdec/trace.py) fix what any drafter would have had accepted at every step: replaying a drafter that needs no
model (n-gram lookup, suffix index) over them reproduces its steps exactly, for any draft length or policy, in
milliseconds. Each replayed step is priced with the verify cost curve measured where the trace was written
(verify(1 + drafted)) plus the drafting time measured here; plain decoding costs verify(1) per token. Drafters
that read the target (draft models, EAGLE, layer-skip) cannot be replayed without it; their logged steps are
reported as they ran. Sampled and constrained requests are left out: a sampled output is one draw, not what a
different drafter's run would have produced, and a constraint's forced tokens replace drafts.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .costs import CostModel
from .policy import DraftLengthPolicy, plan_lengths
from .drafters.base import Budget, Drafter, DraftRequest
from .tokens import common_prefix


@dataclass
class ReplayResult:
    """One policy over the replayed requests; seconds are predicted (verify curve + drafting)."""

    name: str
    tokens: int = 0  # tokens emitted by verify steps (each request's first token comes from its prefill)
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    draft_seconds: float = 0.0
    measured_seconds: float | None = None  # the logged run's own drafting and verify time, for the logged steps
    per_request: list[list[list[int]]] = field(default_factory=list, repr=False)  # [drafted, accepted] per step

    @property
    def mean_accepted_tokens(self) -> float:
        return self.tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_dict(self, plain: "ReplayResult | None" = None) -> dict:
        out = {
            "name": self.name,
            "tokens": self.tokens,
            "steps": self.steps,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "mean_accepted_tokens": self.mean_accepted_tokens,
            "acceptance_rate": self.acceptance_rate,
            "predicted_seconds": self.seconds,
            "draft_seconds": self.draft_seconds,
            "predicted_tokens_per_s": self.tokens_per_s,
        }
        if plain is not None:
            out["predicted_speedup"] = plain.seconds / self.seconds if self.seconds else None
        if self.measured_seconds is not None:
            out["measured_seconds"] = self.measured_seconds
            out["measured_tokens_per_s"] = self.tokens / self.measured_seconds if self.measured_seconds else None
        return out


def replayable(requests: list[dict]) -> list[dict]:
    """The requests a replay can reproduce: greedy, unconstrained, exact acceptance (a lossy rule's steps accepted
    what an exact replay would not), with at least one generated token."""
    return [
        r
        for r in requests
        if r.get("greedy", True)
        and not r.get("constrained")
        and r["output_ids"]
        and r.get("acceptance", "exact") == "exact"
    ]


def replay_plain(requests: list[dict], costs: CostModel) -> ReplayResult:
    """Plain decoding: one verify(1) per token after the first."""
    result = ReplayResult("none")
    for r in requests:
        n = len(r["output_ids"]) - 1
        result.tokens += n
        result.steps += n
        result.seconds += n * costs.verify_s(1)
        result.per_request.append([[0, 0]] * n)
    return result


def replay_logged(requests: list[dict], costs: CostModel) -> ReplayResult:
    """The steps as they ran, priced as replays are (the logged drafting time included)."""
    result = ReplayResult("logged", measured_seconds=0.0)
    for r in requests:
        result.measured_seconds += r.get("verify_s", 0.0) + r.get("draft_s", 0.0)
        result.tokens += len(r["output_ids"]) - 1
        for drafted, accepted in r["steps"]:
            result.steps += 1
            result.drafted += drafted
            result.accepted += accepted
            result.seconds += costs.verify_s(1 + drafted)
        result.draft_seconds += r.get("draft_s", 0.0)
        result.per_request.append([list(s) for s in r["steps"]])
    result.seconds += result.draft_seconds
    return result


def replay_drafter(
    requests: list[dict],
    make: Callable[[], Drafter],
    name: str,
    verify_costs: dict[int, float],
    k: int | None,
    k_max: int = 8,
) -> ReplayResult:
    """Replays a drafter that needs no model over the requests, in order (one drafter forked per request, so a
    suffix index learns each output as a server's does). k: a fixed draft length (drafting every step, capped by
    the tokens left), or None for specdec's adaptive policy with up to k_max drafts, deciding from the trace's
    verify curve and the drafting cost measured as it goes."""
    costs = CostModel(verify_costs)
    root = make()
    result = ReplayResult(name)
    limit = k if k is not None else k_max
    for r in requests:
        prompt, output = list(r["prompt_ids"]), list(r["output_ids"])
        budget = max(r.get("max_new_tokens", len(output)), len(output))
        drafter = root.fork()
        drafter.begin(DraftRequest(prompt_ids=prompt, costs=costs))
        policy = DraftLengthPolicy(limit, costs, adaptive=k is None)
        tokens, done, steps = prompt + output[:1], 1, []
        while done < len(output):
            ks = plan_lengths([policy], costs, [min(limit, budget - done - 1)]).commit()
            draft, seconds = [], 0.0
            if ks[0] > 0:
                t0 = time.perf_counter()
                draft = drafter.propose(tokens, Budget(ks[0])).tokens.tolist()  # chains, as in batches
                seconds = time.perf_counter() - t0
                costs.observe_draft(len(draft), seconds)
            accepted = common_prefix(draft, output[done:])
            emitted = min(accepted + 1, len(output) - done)
            policy.observe(len(draft), accepted)
            steps.append([len(draft), accepted])
            result.seconds += costs.verify_s(1 + len(draft)) + seconds
            result.draft_seconds += seconds
            result.drafted += len(draft)
            result.accepted += accepted
            tokens += output[done : done + emitted]
            done += emitted
        drafter.end()
        drafter.learn(output)
        result.tokens += len(output) - 1
        result.steps += len(steps)
        result.per_request.append(steps)
    return result
