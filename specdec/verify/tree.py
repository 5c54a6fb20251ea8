"""The verification rules over trees of drafts, and a tree's structure (its attention mask, depths, children).

A tree draft: tokens (N,) and parents (N,) with parents[i] < i, -1 for children of the root. The target scores
N + 1 rows: row 0 is the root (the last emitted token), row i + 1 is node i. A rule returns (path, token): the
accepted nodes from the root down, and the token emitted after them (the p / q convention is the package's,
specdec/verify/__init__.py). Every rule here is lossless. The greedy rule walks by the package's greedy_choices, so
it is in __init__.py; lossy acceptance over trees is in lossy.py.
"""

from __future__ import annotations

import torch

from ..sampling import draw


def tree_children(parents: list[int]) -> dict[int, list[int]]:
    """Node -> its children in node order (-1 is the root)."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    return kids


def tree_coupled_verify(
    tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor, noise: torch.Tensor
) -> tuple[list[int], int]:
    """Coupled sampling on a tree: each row's sample is argmax(log p + noise of that row's position)."""
    return tree_walk(tokens.tolist(), parents, (target_probs.log() + noise).argmax(-1).tolist())


def tree_rejection_verify(
    tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """Lossless sampling over a tree of deterministic drafts (one-hot q per child), as in SpecInfer.

    At a node, children t_1..t_m are tried in order: t_i is accepted with probability p'(t_i); on
    rejection t_i is removed from p' and p' renormalised. If all are rejected the token is drawn from
    the final p'. Each emitted token therefore follows p exactly.
    """
    toks = tokens.tolist()
    kids = tree_children(parents)
    path: list[int] = []
    node = -1
    while True:
        p = target_probs[node + 1].clone()
        chosen = None
        for child in kids.get(node, []):
            t = toks[child]
            mass = float(p.sum())
            if mass <= 0:
                break
            u = float(torch.rand(1, generator=generator))
            if u * mass < float(p[t]):
                chosen = child
                break
            p[t] = 0.0
        if chosen is None:
            if not bool(p.sum() > 0):
                p = target_probs[node + 1]
            return path, draw(p / p.sum(), generator)
        path.append(chosen)
        node = chosen


def tree_walk(tokens: list[int], parents: list[int], choice: list[int]) -> tuple[list[int], int]:
    """Walks down from the root while a child carries the token chosen at its parent's row: choice (N + 1,), row 0
    the root's. Returns (path, token): the nodes walked, and the choice at the last one's row."""
    kids = tree_children(parents)
    path: list[int] = []
    node = -1
    while True:
        want = choice[node + 1]
        nxt = next((c for c in kids.get(node, []) if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def tree_mask(parents: list[int]) -> torch.Tensor:
    """(N + 1, N + 1) bool attention among the root and the nodes: each row sees its ancestors and itself."""
    n = len(parents)
    mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
    mask[:, 0] = True
    for i, p in enumerate(parents):
        mask[i + 1] = mask[p + 1] if p >= 0 else mask[0]
        mask[i + 1, i + 1] = True
    return mask


def tree_depths(parents: list[int]) -> list[int]:
    """Depth of each node (children of the root have depth 1)."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth
