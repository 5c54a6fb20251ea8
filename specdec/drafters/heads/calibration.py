"""Calibrating a draft head's confidences against the acceptance the target grants them.

A head's draft probability q of a node (its probability of the node's token given the path above it) is read as
the chance the target accepts the node once its parent is accepted. Heads trained on other text are over- or
under-confident, and differently at each depth, so trees sized from raw q hold nodes that are never accepted or
stop short of nodes that would be. `Calibration` counts, per draft depth and per bucket of q, how many nodes
were tried (their parent was accepted, or they hang under the root) and how many of those were accepted;
`probability` blends those counts with the raw q (a prior worth `prior` trials), so a bucket with little data
stays near q. One Calibration is shared by all requests of a drafter (forks), so what one request observes sizes
the trees of the next.

How a tree's acceptance is read back: the tokens the context gained after the drafted position are matched from
the root down the tree; every node on that path was accepted, the rest were not (`accepted_path`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..trees import path_tokens


class Calibration:
    def __init__(self, depths: int = 8, buckets: int = 10, prior: float = 20.0):
        self.buckets, self.prior = buckets, prior
        self.trials = torch.zeros(depths, buckets, dtype=torch.float64)
        self.accepted = torch.zeros(depths, buckets, dtype=torch.float64)

    def _cell(self, depth: int, q: torch.Tensor) -> tuple[int, torch.Tensor]:
        row = min(max(depth, 1), self.trials.shape[0]) - 1
        return row, (q * self.buckets).long().clamp(0, self.buckets - 1)

    def probability(self, depth: int, q: torch.Tensor) -> torch.Tensor:
        """Calibrated acceptance chances of nodes at `depth` (1: under the root) with draft probabilities q (any
        shape), in (0, 1)."""
        row, col = self._cell(depth, q)
        hits, tries = self.accepted[row, col], self.trials[row, col]
        return ((hits + self.prior * q.double()) / (tries + self.prior)).clamp(1e-6, 1 - 1e-6).to(q.dtype)

    def log_probability(self, depth: int, q: torch.Tensor) -> torch.Tensor:
        return self.probability(depth, q).log()

    def observe(self, depths: list[int], probs: list[float | None], parents: list[int], accepted: set[int]) -> None:
        """One verified tree: node i at depths[i] with draft probability probs[i] (None: a node the head did not
        score, such as the prompt-lookup branch's) under parents[i] (-1: the root); `accepted` holds the nodes on
        the accepted path."""
        for i, (depth, q) in enumerate(zip(depths, probs)):
            if q is None or not (parents[i] < 0 or parents[i] in accepted):
                continue  # never tried: its parent was rejected
            row, col = self._cell(depth, torch.tensor(q))
            self.trials[row, col] += 1
            self.accepted[row, col] += i in accepted

    def summary(self) -> list[dict]:
        """Per depth: tried nodes, the share accepted, and the mean calibrated chance of the buckets seen."""
        out = []
        for d in range(self.trials.shape[0]):
            tries = float(self.trials[d].sum())
            if tries:
                out.append({"depth": d + 1, "tried": int(tries), "accepted": float(self.accepted[d].sum()) / tries})
        return out


def accepted_path(tokens: list[int], parents: list[int], gained: list[int]) -> set[int]:
    """The nodes of a tree (tokens, parents; -1 = the root) that the tokens gained after the drafted position
    follow from the root down: the accepted path."""
    children: dict[int, dict[int, int]] = {}
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        children.setdefault(parent, {})[token] = i
    path: set[int] = set()
    node = -1
    for token in gained:
        child = children.get(node, {}).get(token)
        if child is None:
            break
        path.add(child)
        node = child
    return path


def node_depths(parents: list[int]) -> list[int]:
    """Depth of each node (1 under the root); parents[i] < i."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


@dataclass
class DraftedTree:
    """A tree drafted at context length `start`: its tokens, parents and each node's draft probability (None for a
    node the head did not draft, the lookup branch's), until the target's next tokens tell which were accepted."""

    start: int
    tokens: list[int]
    parents: list[int]
    probs: list[float | None]

    @classmethod
    def of(cls, start: int, draft, tokens: list[int], parents: list[int], probs: list[float]) -> "DraftedTree":
        """The tree `draft` (a Draft with parents) chose from the head's nodes (tokens, parents, probs)."""
        q_of = {tuple(path_tokens(i, tokens, parents)): q for i, q in enumerate(probs)}
        drafted, tree_parents = draft.tokens.tolist(), list(draft.parents)
        return cls(
            start,
            drafted,
            tree_parents,
            [q_of.get(tuple(path_tokens(j, drafted, tree_parents))) for j in range(len(drafted))],
        )

    def observed_by(self, calibration: Calibration, context: list[int]) -> None:
        """Counts into `calibration` which nodes the target accepted, once the context holds the tokens it kept
        after the drafted position."""
        if len(context) > self.start:
            accepted = accepted_path(self.tokens, self.parents, context[self.start :])
            calibration.observe(node_depths(self.parents), self.probs, self.parents, accepted)
