"""Draft trees sized by measured costs, shared by the drafters that build them (EAGLE, Medusa).

A drafter scores candidate nodes by their cumulative draft log-probability (the log of the chance the
target accepts the path to them); `finish_tree` keeps the most probable ones, as many as maximise expected
accepted tokens per second under the measured verify-cost curve, adds the prompt-lookup continuation as
one more branch (`LookupBranch`), and orders the nodes as verification wants them (by depth).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..tokens import common_prefix
from ..verify import tree_children
from .base import Budget, Draft
from .lookup.ngram import NgramDrafter


class LookupBranch:
    """The prompt-lookup continuation of the context, drafted as one more branch of a head's tree; where it is
    expected to be accepted at least as far as the head's recent drafts (text the answer copies from the
    prompt), it is drafted alone, as a chain sized by the verify-cost curve, and the head is skipped."""

    def __init__(self):
        self.lookup = NgramDrafter()
        self.record = LookupRecord()
        self.head_expected: float | None = None  # running mean of the head's expected accepted tokens per draft
        self.chain: list[int] = []

    def start(self, context: list[int], depth_cap: int, costs) -> Draft | None:
        """Finds this step's continuation; returns it as the whole draft where it beats the head, else None."""
        self.record.score(context)
        self.chain = self.lookup.propose(context, Budget(depth_cap)).tokens.tolist()
        self.record.proposed(context, self.chain)
        if self.chain and self.head_expected is not None and self.record.expected(self.chain) >= self.head_expected:
            return Draft(tokens=torch.tensor(self.chain[: self.record.best_length(self.chain, costs)]))
        return None

    def head_drafted(self, expected: float) -> None:
        """Records the expected accepted tokens of the head's draft (a tree, or a chain)."""
        self.head_expected = expected if self.head_expected is None else 0.8 * self.head_expected + 0.2 * expected


def finish_tree(
    tokens: list[int],
    parents: list[int],
    depths: list[int],
    scores: list[float],
    costs,
    max_nodes: int,
    branch: LookupBranch | None = None,
    fixed_size: bool = False,
) -> Draft:
    """The draft of a scored candidate tree (parents[i] < i, -1 under the root; scores: cumulative log-probs):
    the nodes that pay under `costs` (fixed_size: the `max_nodes` most probable), plus the lookup branch's
    continuation, ordered by depth."""
    chosen = choose_nodes(scores, parents, costs, max_nodes, fixed_size)
    if branch is not None:
        branch.head_drafted(sum(math.exp(scores[i]) for i in chosen))
        if branch.chain:
            chosen = add_path(chosen, branch.chain, tokens, parents, depths, scores)
    order = sorted(chosen, key=lambda i: (depths[i], -scores[i]))
    index = {node: j for j, node in enumerate(order)}
    return Draft(
        tokens=torch.tensor([tokens[i] for i in order], dtype=torch.long),
        parents=[index[parents[i]] if parents[i] >= 0 else -1 for i in order],
    )


class LookupRecord:
    """How far prompt-lookup continuations were accepted in this request: each drafted continuation token counts
    as a trial of a geometric run (accepted, or the first rejected one), so the chance a next token is accepted is
    (accepted + 1) / (trials + 2)."""

    def __init__(self):
        self.accepted, self.trials = 0, 0
        self.pending: tuple[int, list[int]] | None = None  # (context length, continuation) drafted last

    def proposed(self, context: list[int], chain: list[int]) -> None:
        self.pending = (len(context), chain) if chain else None

    def score(self, context: list[int]) -> None:
        """Compares the last drafted continuation with what the context now holds after it."""
        if self.pending is None:
            return
        start, chain = self.pending
        self.pending = None
        after = context[start : start + len(chain)]
        if not after:
            return
        kept = common_prefix(chain, after)
        self.accepted += kept
        self.trials += kept + (kept < len(after))  # a differing token is one rejected trial

    def rate(self) -> float:
        return (self.accepted + 1) / (self.trials + 2)

    def expected(self, chain: list[int]) -> float:
        """Expected accepted tokens of the continuation."""
        a = self.rate()
        return sum(a**i for i in range(1, len(chain) + 1))

    def best_length(self, chain: list[int], costs) -> int:
        """The prefix of the continuation with the most expected tokens per second of verification."""
        a, best, best_rate, expected = self.rate(), 1, 0.0, 1.0
        for n in range(1, len(chain) + 1):
            expected += a**n
            rate = expected / costs.verify_s(n + 1)
            if rate > best_rate:
                best, best_rate = n, rate
        return best


def path_tokens(node: int, tokens: list[int], parents: list[int]) -> list[int]:
    """The drafted tokens from the root down to node (none for the root, -1)."""
    path = []
    while node >= 0:
        path.append(tokens[node])
        node = parents[node]
    return path[::-1]


def add_path(
    chosen: list[int], chain: list[int], tokens: list[int], parents: list[int], depths: list[int], scores: list[float]
) -> list[int]:
    """Adds `chain` as a path from the root, through chosen nodes where they already hold its tokens (siblings
    stay distinct); new nodes are appended to the node lists with the lowest score. Returns the chosen set."""
    kept = set(chosen)
    child = {(parents[i], tokens[i]): i for i in kept}
    node = -1
    for depth, token in enumerate(chain, start=1):
        if (node, token) not in child:
            tokens.append(token)
            parents.append(node)
            depths.append(depth)
            scores.append(-math.inf)
            child[(node, token)] = len(tokens) - 1
            kept.add(len(tokens) - 1)
        node = child[(node, token)]
    return sorted(kept)


def tree_width(costs, headroom: float = 1.25, low: int = 2, high: int = 8) -> int:
    """Candidates kept per level: half the tokens one verify pass takes within `headroom` times the cost of a
    one-token pass (a flat curve, as on GPUs, affords wide trees; a compute-bound CPU, narrow ones)."""
    base, T = costs.verify_s(1), 1
    while T < 64 and costs.verify_s(T + 1) <= headroom * base:
        T += 1
    return max(low, min(high, T // 2))


def expand_floor(costs) -> float:
    """Smallest probability of reaching a node that can still pay for a deeper level: the marginal
    cost of one more verified token relative to a one-token pass, from the measured curve."""
    return max(0.02, min(0.5, (costs.verify_s(9) - costs.verify_s(8)) / costs.verify_s(1)))


def choose_nodes(scores: list[float], parents: list[int], costs, max_nodes: int, fixed_size: bool = False) -> list[int]:
    """The most probable nodes, closed under ancestors, as many as maximise E[accepted + 1] / verify cost
    (fixed_size: `max_nodes` of them, whatever they cost)."""
    order = sorted(range(len(scores)), key=lambda i: -scores[i])[:max_nodes]
    best = len(order) if fixed_size else paying_count([scores[i] for i in order], costs)
    chosen = set(order[:best])
    for i in list(chosen):
        a = parents[i]
        while a >= 0 and a not in chosen:
            chosen.add(a)
            a = parents[a]
    return sorted(chosen)


def paying_count(scores: list[float], costs) -> int:
    """How many of the nodes (cumulative log-probs, most probable first) maximise E[accepted + 1] / verify cost."""
    best, best_rate, expected = 0, 1.0 / costs.verify_s(1), 1.0
    for n, score in enumerate(scores, start=1):
        expected += math.exp(score)
        rate = expected / costs.verify_s(n + 1)
        if rate > best_rate:
            best, best_rate = n, rate
    return best


def level_visibility(frontier: list[int], parents: list[int], n_true: int, fed: list[int]) -> torch.Tensor:
    """Which head keys each node of a tree's new level sees, (F, n_true + len(fed) + F) bool: the n_true true pairs,
    its ancestors among the nodes already fed (in `fed`'s order after the true pairs), and itself."""
    visible = torch.zeros(len(frontier), n_true + len(fed) + len(frontier), dtype=torch.bool)
    visible[:, :n_true] = True
    slot = {node: n_true + j for j, node in enumerate(fed)}
    for r, node in enumerate(frontier):
        a = parents[node]
        while a >= 0:
            visible[r, slot[a]] = True
            a = parents[a]
        visible[r, n_true + len(fed) + r] = True
    return visible


@dataclass
class TreeNodes:
    """A tree being drafted: each node's token, parent (-1: the root), score (the cumulative log-probability of
    its acceptance) and draft probability, in the order the nodes were made (parents[i] < i)."""

    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)

    def grow(
        self, frontier: list[int], logits: torch.Tensor, width: int, draft_ids: torch.Tensor, calibrated=None
    ) -> list[int]:
        """The next level (EAGLE-2): of every frontier node's `width` most probable children under the head's
        logits (F, K) over the draft vocabulary (draft_ids: draft index -> token), the `width` with the highest
        cumulative score (the draft log-probabilities, or calibrated(q) of each probability q where a calibration
        maps them to log-probabilities of acceptance), added as nodes; returns the new frontier, most probable
        first. A frontier node -1 is the root."""
        top = torch.topk(logits, width, dim=-1)  # log-softmax of only the kept values: a pass over K saved
        top_lp = top.values - torch.logsumexp(logits, -1, keepdim=True)
        base = torch.tensor([self.scores[n] if n >= 0 else 0.0 for n in frontier])
        step = top_lp if calibrated is None else calibrated(top_lp.exp())
        total = (base[:, None] + step).flatten()  # (F * width,) cumulative log-probs of acceptance
        raw_q = top_lp.exp().flatten().tolist()
        keep = torch.topk(total, min(width, total.numel())).indices.tolist()  # most probable first
        cand_scores, cand_ids = total.tolist(), top.indices.flatten().tolist()
        grown = []
        for c in keep:
            self.tokens.append(int(draft_ids[cand_ids[c]]))
            self.parents.append(frontier[c // width])
            self.scores.append(cand_scores[c])
            self.probs.append(raw_q[c])
            grown.append(len(self.tokens) - 1)
        return grown


def draft_accepted(tokens: list[int], parents: list[int] | None, after: list[int]) -> int | None:
    """How many of a draft's tokens (a chain, or a tree by its parents) the target kept, read from the tokens it wrote
    after the drafted position (`after`), or None while those do not tell yet. Exact under greedy decoding and
    rejection sampling alike: a drafted token is accepted if and only if the target emits it there."""
    if parents is None:
        m = common_prefix(tokens, after)
        return m if m < len(after) or m == len(tokens) else None
    children = tree_children(parents)
    node, depth = -1, 0
    while children.get(node):
        if depth >= len(after):
            return None
        child = next((c for c in children[node] if tokens[c] == after[depth]), None)
        if child is None:
            return depth
        node, depth = child, depth + 1
    return depth
