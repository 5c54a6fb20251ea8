"""Verification: pure tensor functions that decide which drafted tokens the target accepts.

Convention, used throughout specdec: p is the target's distribution, q the drafter's.
A step drafts k tokens d_0..d_{k-1}; the target scores k+1 positions, where row i of its output
predicts the token after the context extended by d_0..d_{i-1}. A rule returns (n, token):
  accepted  - d_0..d_{n-1}, the longest prefix the rule keeps (0 <= n <= k);
  recovered - when n < k, `token` replaces the rejected d_n, drawn from the target alone;
  bonus     - when n == k, `token` is one more draw from row k, free of charge.
Each step therefore emits n + 1 tokens. Every rule in this module is lossless: the emitted tokens
follow exactly the target's greedy choice or sampling distribution. (None is lossy.)
"""
from __future__ import annotations

import torch


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Accepts drafts while they equal the target's argmax.

    draft: (k,) int64; target_logits: (k+1, V). Returns (n, token).
    Example: draft [5, 7, 9], argmax rows [5, 7, 2, 4] -> (2, 2): 5 and 7 accepted, 2 recovered.
    """
    choice = target_logits.argmax(-1)  # (k+1,)
    return _longest_match(draft, choice)


def coupled_verify(draft: torch.Tensor, target_probs: torch.Tensor, noise: torch.Tensor) -> tuple[int, int]:
    """Sampling by Gumbel coupling: the target's sample at row i is argmax(log p_i + noise_i).

    draft: (k,); target_probs: (k+1, V); noise: (k+1, V) Gumbel noise fixed by (seed, position).
    A draft token is accepted when it equals the target's own sample there, so the output is the
    very sequence that non-speculative sampling with the same noise gives (lossless and seed-stable).
    """
    choice = (target_probs.log() + noise).argmax(-1)  # (k+1,)
    return _longest_match(draft, choice)


def rejection_verify(draft: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[int, int]:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    draft: (k,); draft_probs q: (k, V), or None for a deterministic drafter (q is one-hot on the
    draft); target_probs p: (k+1, V). Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the
    first rejection draw from norm(max(0, p_i - q_i)); if all k are accepted draw the bonus from p_k.
    """
    k = draft.shape[0]
    rows = torch.arange(k, device=target_probs.device)
    p_draft = target_probs[rows, draft]  # (k,)
    q_draft = draft_probs[rows, draft] if draft_probs is not None else torch.ones_like(p_draft)
    u = torch.rand(k, generator=generator, device=generator.device if generator is not None else "cpu")
    u = u.to(target_probs.device)
    rejected = (u * q_draft >= p_draft).nonzero()  # u >= p/q, without dividing by q
    n = int(rejected[0, 0]) if rejected.numel() else k
    if n == k:
        return k, _draw(target_probs[k], generator)
    if draft_probs is not None:
        residual = (target_probs[n] - draft_probs[n]).clamp_(min=0)
    else:
        residual = target_probs[n].clone()
        residual[draft[n]] = 0.0
    total = residual.sum()
    if not bool(total > 0):  # only reachable through rounding when p == q; p is then exact
        residual = target_probs[n]
    return n, _draw(residual / residual.sum(), generator)


def _draw(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs (V,), drawn on the generator's device."""
    if generator is not None and probs.device != generator.device:
        probs = probs.to(generator.device)
    return int(torch.multinomial(probs, 1, generator=generator))


def _longest_match(draft: torch.Tensor, choice: torch.Tensor) -> tuple[int, int]:
    """(n, choice[n]) where n is the length of the longest prefix with draft == choice. choice: (k+1,)."""
    k = draft.shape[0]
    if k == 0:
        return 0, int(choice[0])
    mismatch = (draft != choice[:k]).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else k
    return n, int(choice[n])


# ---- trees ---------------------------------------------------------------------------------------
# A tree draft: tokens (N,) and parents (N,) with parents[i] < i, -1 for children of the root. The
# target scores N + 1 rows: row 0 is the root (the last emitted token), row i + 1 is node i. A rule
# returns (path, token): the accepted nodes from the root down, and the token emitted after them.


def tree_children(parents: list[int]) -> dict[int, list[int]]:
    """Node -> its children in node order (-1 is the root)."""
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    return kids


def tree_greedy_verify(tokens: torch.Tensor, parents: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Walks down from the root while a child carries the target's argmax. target_logits: (N + 1, V)."""
    return _walk(tokens.tolist(), parents, target_logits.argmax(-1).tolist())


def tree_coupled_verify(tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor,
                        noise: torch.Tensor) -> tuple[list[int], int]:
    """Coupled sampling on a tree: each row's sample is argmax(log p + noise of that row's position)."""
    return _walk(tokens.tolist(), parents, (target_probs.log() + noise).argmax(-1).tolist())


def tree_rejection_verify(tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor,
                          generator: torch.Generator | None) -> tuple[list[int], int]:
    """Lossless sampling over a tree of deterministic drafts (one-hot q per child), as in SpecInfer.

    At a node, children t_1..t_m are tried in order: t_i is accepted with probability p'(t_i); on
    rejection t_i is removed from p' and p' renormalised. If all are rejected the token is drawn from
    the final p'. Each emitted token therefore follows p exactly.
    """
    toks = tokens.tolist()
    kids = tree_children(parents)
    path, node = [], -1
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
            return path, _draw(p / p.sum(), generator)
        path.append(chosen)
        node = chosen


def _walk(tokens: list[int], parents: list[int], choice: list[int]) -> tuple[list[int], int]:
    kids = tree_children(parents)
    path, node = [], -1
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
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth
