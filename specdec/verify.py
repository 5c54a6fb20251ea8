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
