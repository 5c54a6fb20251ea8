"""Greedy verification computed where the logits are (a GPU), with one host synchronisation per request per step.

The host rules (_longest_match, tree._walk) read the target's choices one by one, each read a synchronisation on a
GPU. Here the accepted count or path is computed with tensor operations, and one `.tolist()` brings back everything
the step needs. They give exactly what the host rules give (tests/test_device_verify.py checks them against those
definitions); on the CPU the host rules stay, as they are faster there.
"""
from __future__ import annotations

import torch


def chain_greedy_on_device(draft: torch.Tensor, choice: torch.Tensor) -> tuple[int, int]:
    """(n, choice[n]) where n is the length of the longest prefix with draft == choice.

    draft: (k,) int64; choice: (k + 1,) int64, the target's argmax of each scored row, on the same device.
    Example: draft [5, 7, 9], choice [5, 7, 2, 4] -> (2, 2).
    """
    k = draft.shape[0]
    if k == 0:  # plain decoding: the one choice is the token (one read-back, no matching)
        return 0, int(choice[0])
    n = (draft == choice[:k]).long().cumprod(0).sum()  # () int64: matches before the first mismatch
    token = choice.gather(0, n.view(1))  # (1,): indexed on the device, not read back
    n_host, token_host = torch.cat([n.view(1), token]).tolist()
    return n_host, token_host


def tree_greedy_on_device(tokens: torch.Tensor, parents: list[int], choice: torch.Tensor) -> tuple[list[int], int]:
    """(path, token) of a tree draft: from the root down, the first child (in node order) that carries its parent's
    argmax, as far as there is one; token: the argmax after the path's last node.

    tokens: (N,) int64; parents: N parent indices (parents[i] < i, -1 under the root); choice: (N + 1,) int64, the
    target's argmax of the root's row and each node's, on the same device as tokens.
    """
    N = len(parents)
    if N == 0:
        return [], int(choice[0])
    device = choice.device
    # built on the host and copied without waiting (a blocking copy synchronises like a read-back)
    parent_rows = torch.tensor([p + 1 for p in parents]).to(device, non_blocking=True)
    carries = tokens == choice.gather(0, parent_rows)  # (N,): node i is its parent's argmax
    same_parent = torch.tensor(parents)[:, None] == torch.tensor(parents)[None, :]
    earlier_sibling = (same_parent & torch.ones(N, N, dtype=torch.bool).tril_(-1)).to(device, non_blocking=True)
    first = carries & ~(earlier_sibling & carries[None, :]).any(-1)  # the child a walk down would take
    ancestors = _ancestors(parents).to(device, non_blocking=True)  # (N, N): i's ancestors and i itself
    on_path = ~(ancestors & ~first[None, :]).any(-1)  # (N,): i and all its ancestors taken
    rows = torch.arange(1, N + 1, device=device)
    last_row = (on_path * rows).max()  # the deepest accepted node's row (nodes on a path ascend); 0: the root
    token = choice.gather(0, last_row.view(1))
    values = torch.cat([on_path.long(), token]).tolist()
    return [i for i in range(N) if values[i]], values[N]


def _ancestors(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: row i marks node i's ancestors and i itself."""
    from .tree import tree_mask

    return tree_mask(parents)[1:, 1:]
