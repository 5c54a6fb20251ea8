"""Verification: which drafted tokens the target accepts, and the token it emits after them.

Convention, used throughout specdec: p is the target's distribution, q the drafter's.
A step drafts k tokens d_0..d_{k-1}; the target scores k+1 positions, where row i of its output
predicts the token after the context extended by d_0..d_{i-1}. A rule returns (n, token):
  accepted  - d_0..d_{n-1}, the longest prefix the rule keeps (0 <= n <= k);
  recovered - when n < k, `token` replaces the rejected d_n, drawn from the target alone;
  bonus     - when n == k, `token` is one more draw from row k, free of charge.
Each step therefore emits n + 1 tokens. A step without drafts (k = 0, plain decoding) is the same rule: its
one row gives the bonus token, the target's argmax or sample.

Lossless rules (the default, acceptance "exact"): the emitted tokens follow exactly the target's greedy choice or
sampling distribution. Those here and in tree.py are all lossless.
LOSSY rules (lossy.py, opt-in through SpeculationConfig.acceptance: top-k, threshold, typical) also accept drafts
the target finds plausible without choosing them: faster, but the text is no longer the target's own, and every
output made so is labelled lossy (metrics, CLI, bench JSON, server responses).

`verify` picks the rule: a lossy one where asked; else greedy (temperature 0), coupled sampling or rejection
sampling (SpeculationConfig's sampling_verifier), for a chain (here) or a tree (tree.py). The rules are pure
functions of tensors. Where the logits are not on the CPU (a GPU) the exact rules run as tensor operations with one
host synchronisation per step (device.py: greedy; device_sampling.py: rejection and coupled sampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from ..config import EXACT, Acceptance, SamplingConfig
from ..sampling import draw, probs_from_logits
from .device import chain_greedy_on_device, tree_greedy_on_device
from .device_sampling import (
    chain_coupled_on_device,
    chain_rejection_on_device,
    tree_coupled_on_device,
    tree_rejection_on_device,
)
from .lossy import acceptable, lossy_verify
from .tree import tree_children, tree_coupled_verify, tree_depths, tree_mask, tree_rejection_verify, tree_walk


@dataclass
class Draft:
    """What a drafter proposes for one step: a chain of k tokens, or a tree of k nodes."""

    tokens: torch.Tensor  # (k,) int64, on the CPU
    probs: torch.Tensor | None = None  # (k, V) q over the target's vocabulary, or None (one-hot); chains only
    parents: list[int] | None = None  # a tree: parents[i] < i, -1 under the root; None for a chain
    source: str | None = None  # the drafter that drafted it, where a selector chose among several

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def positions(self) -> int:
        """Positions drafted ahead: the length of a chain, the depth of a tree (what drafting cost scales with)."""
        if not self.parents:
            return len(self)
        return max(tree_depths(self.parents))

    def head(self, n: int) -> "Draft":
        """The first n drafts: a chain's prefix, or a tree's first n nodes (which hold their ancestors, parents[i] < i)."""
        if n >= len(self):
            return self
        return Draft(
            tokens=self.tokens[:n],
            probs=None if self.probs is None else self.probs[:n],
            parents=None if self.parents is None else self.parents[:n],
            source=self.source,
        )

    @staticmethod
    def empty() -> "Draft":
        return Draft(tokens=torch.empty(0, dtype=torch.long))


def verify(
    draft: Draft,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    generator: torch.Generator | None = None,
    noise: Callable[[list[int]], torch.Tensor] | None = None,
    acceptance: Acceptance = EXACT,
) -> tuple[list[int], int]:
    """(accepted path, next token) for a draft the target scored.

    draft: k tokens, a chain or a tree (k = 0: a plain step); logits: (k + 1, V), the target's logits of the scored
    rows after the request's penalties and constraint (logits.py); sampling: temperature 0 is greedy, else the
    sampler chain that forms p; generator: the request's random stream, for rejection sampling; noise: for coupled
    sampling, depths -> (len(depths), V) Gumbel noise of the rows that many tokens past the context (None:
    rejection sampling); acceptance: exact (lossless), or a LOSSY rule (lossy.py). path: the accepted drafts'
    indices from the first on (a chain's: 0..n-1).
    Example (greedy): draft [5, 7, 9], argmax rows [5, 7, 2, 4] -> ([0, 1], 2).
    """
    if acceptance.lossy and len(draft):  # without drafts every rule emits what the exact one does
        return lossy_verify(draft.tokens, draft.parents, logits, sampling, acceptance, generator, noise)
    on_device = logits.device.type != "cpu"  # one host synchronisation per step there (device_sampling.py)
    if draft.parents is not None:
        if sampling.greedy:
            return tree_greedy_verify(draft.tokens, draft.parents, logits)
        p = probs_from_logits(logits, sampling)
        tokens = draft.tokens.to(p.device, non_blocking=True)
        if noise is not None:
            coupled = tree_coupled_on_device if on_device else tree_coupled_verify
            return coupled(tokens, draft.parents, p, noise([0] + tree_depths(draft.parents)))
        return (tree_rejection_on_device if on_device else tree_rejection_verify)(tokens, draft.parents, p, generator)
    tokens = draft.tokens.to(logits.device, non_blocking=True)
    if sampling.greedy:
        n, token = greedy_verify(tokens, logits)
    else:
        p = probs_from_logits(logits, sampling)
        if noise is not None:
            n, token = (chain_coupled_on_device if on_device else coupled_verify)(
                tokens, p, noise(list(range(len(draft) + 1)))
            )
        else:
            q = None if draft.probs is None else draft.probs.to(p.device, non_blocking=True)
            n, token = (chain_rejection_on_device if on_device else rejection_verify)(tokens, q, p, generator)
    return list(range(n)), token


def greedy_choices(scores: torch.Tensor) -> torch.Tensor:
    """argmax over the last dimension of scores (..., V), the first of equal maxima as torch.argmax takes it. For
    float32 scores on the CPU it is numpy's, about ten times faster over a vocabulary of 49,152 (torch's took 30-90
    microseconds a row, several times a step); elsewhere torch's."""
    if scores.device.type == "cpu" and scores.dtype == torch.float32:
        return torch.from_numpy(np.asarray(scores.detach().numpy().argmax(-1)))
    return scores.argmax(-1)


def tree_greedy_verify(tokens: torch.Tensor, parents: list[int], target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Walks down from the root while a child carries the target's argmax. target_logits: (N + 1, V)."""
    choice = greedy_choices(target_logits)  # (N + 1,)
    if choice.device.type != "cpu":  # one host synchronisation instead of one per read
        return tree_greedy_on_device(tokens.to(choice.device, non_blocking=True), parents, choice)
    return tree_walk(tokens.tolist(), parents, choice.tolist())


def greedy_verify(draft: torch.Tensor, target_logits: torch.Tensor) -> tuple[int, int]:
    """Accepts drafts while they equal the target's argmax.

    draft: (k,) int64; target_logits: (k+1, V). Returns (n, token).
    Example: draft [5, 7, 9], argmax rows [5, 7, 2, 4] -> (2, 2): 5 and 7 accepted, 2 recovered.
    """
    choice = greedy_choices(target_logits)  # (k+1,)
    if choice.device.type != "cpu":  # one host synchronisation instead of one per read
        return chain_greedy_on_device(draft.to(choice.device, non_blocking=True), choice)
    # a few tokens a step: compared as Python ints, without the tensor operations' fixed costs
    drafted, chosen = draft.tolist(), choice.tolist()
    n = next((i for i, (d, c) in enumerate(zip(drafted, chosen)) if d != c), len(drafted))
    return n, chosen[n]


def coupled_verify(draft: torch.Tensor, target_probs: torch.Tensor, noise: torch.Tensor) -> tuple[int, int]:
    """Sampling by Gumbel coupling: the target's sample at row i is argmax(log p_i + noise_i).

    draft: (k,); target_probs: (k+1, V); noise: (k+1, V) Gumbel noise fixed by (seed, position).
    A draft token is accepted when it equals the target's own sample there, so the output is the
    very sequence that non-speculative sampling with the same noise gives (lossless and seed-stable).
    """
    choice = (target_probs.log() + noise).argmax(-1)  # (k+1,)
    return _longest_match(draft, choice)


def rejection_verify(
    draft: torch.Tensor, draft_probs: torch.Tensor | None, target_probs: torch.Tensor, generator: torch.Generator | None
) -> tuple[int, int]:
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
        return k, draw(target_probs[k], generator)
    if draft_probs is not None:
        residual = (target_probs[n] - draft_probs[n]).clamp_(min=0)
    else:
        residual = target_probs[n].clone()
        residual[draft[n]] = 0.0
    total = residual.sum()
    if not bool(total > 0):  # only reachable through rounding when p == q; p is then exact
        residual = target_probs[n]
    return n, draw(residual / residual.sum(), generator)


def _longest_match(draft: torch.Tensor, choice: torch.Tensor) -> tuple[int, int]:
    """(n, choice[n]) where n is the length of the longest prefix with draft == choice. choice: (k+1,)."""
    k = draft.shape[0]
    if k == 0:
        return 0, int(choice[0])
    mismatch = (draft != choice[:k]).nonzero()
    n = int(mismatch[0, 0]) if mismatch.numel() else k
    return n, int(choice[n])


__all__ = [
    "Draft",
    "acceptable",
    "coupled_verify",
    "greedy_choices",
    "greedy_verify",
    "lossy_verify",
    "rejection_verify",
    "tree_children",
    "tree_coupled_verify",
    "tree_depths",
    "tree_greedy_verify",
    "tree_mask",
    "tree_rejection_verify",
    "verify",
]
