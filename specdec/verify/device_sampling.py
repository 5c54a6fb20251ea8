"""Sampling verification computed where the target's probabilities are (a GPU), with one host synchronisation.

The host rules (rejection_verify, coupled_verify in __init__.py; tree_rejection_verify, tree_coupled_verify in
tree.py) read values one by one (the first rejection, a residual's mass, each uniform, the drawn token), each read a
synchronisation on a GPU. Here every row's decision is a tensor operation, the first rejection (or the walk down a
tree) is selected on the device, the residual of that row is formed and drawn from there, and one `.tolist()` brings
back the accepted path and the next token. verify() takes these where the logits are not on the CPU; on the CPU the
host rules stay (they are faster there), and these run on CPU tensors too, which is how tests exercise them.

The rules are the host rules', so they are as lossless (tests/test_device_sampling.py checks the emitted tokens'
distribution); only how the random numbers are spent differs:
  - one uniform per drafted token (its accept test) and one for the final draw, drawn at once (float64) from the
    request's generator, on that generator's device (a CPU one's are copied over without waiting);
  - the final token is drawn by inverting the float64 cumulative sum of its row with that one uniform (exact to
    float64 rounding; torch.multinomial would need a generator on the probabilities' device).
The coupled rules draw nothing: their choices are argmax(log p + noise), the same tensors as the host rules', walked
as the greedy rules on the device walk the argmax (device.py), so their tokens are the host rules' exactly.
"""

from __future__ import annotations

import torch

from .device import chain_greedy_on_device, earlier_siblings, tree_greedy_on_device, tree_path_on_device


def chain_rejection_on_device(
    draft: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
    """(n, token) by speculative sampling, as rejection_verify: d_i is accepted with probability
    min(1, p_i(d_i) / q_i(d_i)); at the first rejection n the token is drawn from norm(max(0, p_n - q_n)) (q one-hot
    on d_n where draft_probs is None); with all k accepted, from p_k.

    draft: (k,) int64; draft_probs q: (k, V) or None; target_probs p: (k + 1, V); all on one device.
    """
    k, V = draft.shape[0], target_probs.shape[-1]
    device = target_probs.device
    u = uniforms(k + 1, generator, device)  # k accept tests, then the final draw
    rows = torch.arange(k, device=device)
    p_draft = target_probs[rows, draft].double()  # (k,)
    q_draft = draft_probs[rows, draft].double() if draft_probs is not None else torch.ones_like(p_draft)
    rejected = u[:k] * q_draft >= p_draft  # u >= p/q, without dividing by q
    n = (~rejected).long().cumprod(0).sum()  # () int64: accepted before the first rejection
    p_n = target_probs.index_select(0, n.view(1))  # (1, V)
    if draft_probs is not None:
        q_rows = torch.cat([draft_probs.to(p_n.dtype), p_n.new_zeros(1, V)])  # row k: the bonus, nothing taken off
        residual = (p_n - q_rows.index_select(0, n.view(1))).clamp_(min=0)
    else:
        drafted = torch.cat([draft, draft.new_full((1,), -1)]).index_select(0, n.view(1))  # (1,): -1 at row k
        residual = p_n.masked_fill(torch.arange(V, device=device)[None, :] == drafted[:, None], 0.0)
    token = draw_rows(_or_target(residual, p_n), u[k:])  # (1,)
    n_host, token_host = torch.cat([n.view(1), token]).tolist()
    return n_host, token_host


def chain_coupled_on_device(draft: torch.Tensor, target_probs: torch.Tensor, noise: torch.Tensor) -> tuple[int, int]:
    """(n, token) by Gumbel coupling, as coupled_verify: the target's sample at row i is argmax(log p_i + noise_i),
    and drafts are kept while they equal it. draft: (k,); target_probs, noise: (k + 1, V) on one device."""
    return chain_greedy_on_device(draft, (target_probs.log() + noise).argmax(-1))


def tree_coupled_on_device(
    tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor, noise: torch.Tensor
) -> tuple[list[int], int]:
    """(path, token) by Gumbel coupling on a tree, as tree_coupled_verify. tokens: (N,); target_probs, noise:
    (N + 1, V), row 0 the root's, on one device."""
    return tree_greedy_on_device(tokens, parents, (target_probs.log() + noise).argmax(-1))


def tree_rejection_on_device(
    tokens: torch.Tensor, parents: list[int], target_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[list[int], int]:
    """(path, token) by SpecInfer's rule for deterministic drafts, as tree_rejection_verify: at a node its children
    t_1..t_m are tried in order, t_i accepted with probability p'(t_i) / sum(p'), where p' is the node's row of p
    with the earlier children's tokens taken out; where none is accepted the token is drawn from the final p'.

    Every node's test is computed at once: p'(t_i) is p(t_i), or 0 where an earlier sibling carries the same token;
    sum(p') is the row's mass less that of the earlier siblings' distinct tokens. A walk down the nodes that pass
    their test (tree_path_on_device) then gives the path, and the final p' is the last node's row without all its
    children's tokens (none of them was accepted).
    tokens: (N,) int64; parents: N parent indices (parents[i] < i, -1 under the root); target_probs: (N + 1, V).
    """
    N, V = len(parents), target_probs.shape[-1]
    device = target_probs.device
    u = uniforms(N + 1, generator, device)  # one test per node (used where the walk tries it), then the draw
    parent_rows = torch.tensor([p + 1 for p in parents], dtype=torch.long).to(device, non_blocking=True)
    earlier = earlier_siblings(parents).to(device, non_blocking=True)  # (N, N)
    p_at = target_probs[parent_rows, tokens].double()  # (N,): p of the parent's row at the node's token
    repeated = (earlier & (tokens[:, None] == tokens[None, :])).any(-1)  # an earlier sibling holds the same token
    p_left = p_at.masked_fill(repeated, 0.0)  # p'(t_i); a token counts once in what earlier siblings take out
    mass = target_probs.double().sum(-1).index_select(0, parent_rows) - (earlier.double() * p_left[None, :]).sum(-1)
    accepted = (u[:N] * mass < p_left) & (mass > 0)  # (N,)
    on_path, last_row = tree_path_on_device(accepted, parents)
    p_last = target_probs.index_select(0, last_row.view(1))  # (1, V)
    children = (parent_rows == last_row).long()  # (N,): the last node's children, all rejected
    taken = torch.zeros(V, dtype=torch.long, device=device).scatter_add_(0, tokens, children)  # (V,)
    token = draw_rows(_or_target(p_last.masked_fill(taken[None, :] > 0, 0.0), p_last), u[N:])
    values = torch.cat([on_path.long(), token]).tolist()
    return [i for i in range(N) if values[i]], values[N]


def uniforms(count: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """(count,) float64 uniforms in [0, 1) from `generator` (None: the default one of `device`), on `device`."""
    where = generator.device if generator is not None else device
    u = torch.rand(count, generator=generator, device=where, dtype=torch.float64)
    return u.to(device, non_blocking=True)  # a CPU generator's few numbers, copied without waiting


def draw_rows(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row by inverting the cumulative distribution: probs (R, V), non-negative, each row with
    positive mass (it need not sum to 1); u: (R,) uniforms in [0, 1). Returns (R,) int64, token t with probability
    probs[r, t] / probs[r].sum(), up to float64 rounding. A zero-probability token is never drawn."""
    cdf = probs.double().cumsum(-1)  # (R, V)
    index = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)  # first cdf > u * mass
    # u * mass can round up to the mass itself: take the last token with mass then
    last = ((probs > 0) * torch.arange(probs.shape[-1], device=probs.device)).amax(-1)
    return torch.minimum(index, last)


def _or_target(residual: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The residual rows (R, V), where a row has lost all its mass p's row instead: only reachable through rounding
    where p == q, and p is then the exact distribution."""
    return torch.where(residual.sum(-1, keepdim=True) > 0, residual, p)
