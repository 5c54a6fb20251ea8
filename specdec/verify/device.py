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
    parent_rows = torch.tensor([p + 1 for p in parents]).to(choice.device, non_blocking=True)
    carries = tokens == choice.gather(0, parent_rows)  # (N,): node i is its parent's argmax
    on_path, last_row = tree_path_on_device(carries, parents)
    token = choice.gather(0, last_row.view(1))
    values = torch.cat([on_path.long(), token]).tolist()
    return [i for i in range(N) if values[i]], values[N]


def tree_path_on_device(takes: torch.Tensor, parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk down a tree computed at once: from the root, the first child (in node order) that `takes` marks,
    as far as there is one.

    takes: (N,) bool on the device, node i would be taken where the walk reaches its parent (and no earlier
    sibling is taken); parents: N parent indices (parents[i] < i, -1 under the root). Returns on_path (N,) bool,
    the nodes walked, and last_row () int64, the deepest walked node's row (node i's row is i + 1; 0: the root).
    """
    N, device = len(parents), takes.device
    if N == 0:
        return takes.clone(), torch.zeros((), dtype=torch.long, device=device)
    # built on the host and copied without waiting (a blocking copy synchronises like a read-back)
    earlier_sibling = earlier_siblings(parents).to(device, non_blocking=True)
    first = takes & ~(earlier_sibling & takes[None, :]).any(-1)  # the child a walk down would take
    ancestors = _ancestors(parents).to(device, non_blocking=True)  # (N, N): i's ancestors and i itself
    on_path = ~(ancestors & ~first[None, :]).any(-1)  # (N,): i and all its ancestors taken
    rows = torch.arange(1, N + 1, device=device)
    return on_path, (on_path * rows).max()  # nodes on a path ascend: the deepest has the largest row


def earlier_siblings(parents: list[int]) -> torch.Tensor:
    """(N, N) bool on the CPU: row i marks the nodes j < i under the same parent as i."""
    parent, node = torch.tensor(parents, dtype=torch.long), torch.arange(len(parents))
    return (parent[:, None] == parent[None, :]) & (node[:, None] > node[None, :])  # (a bool tril_ is slow on CPUs)


def _ancestors(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: row i marks node i's ancestors and i itself."""
    from .tree import tree_mask

    return tree_mask(parents)[1:, 1:]
