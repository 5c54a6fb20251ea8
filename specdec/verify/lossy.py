"""LOSSY acceptance rules (opt-in, never the default): they accept a draft the target finds plausible, not only
the token it would choose, so the output is no longer the target's own. Use only where a different text is fine.

The p / q convention and the (path, token) contract are the package's (specdec/verify/__init__.py). Here p_i is
the target's distribution at row i: the sampling distribution when sampling (probs_from_logits), softmax of the
processed logits at temperature 1 when greedy. The rules (config.Acceptance) accept d_i while
  top-k:K        d_i is among the K most probable tokens of p_i (ties ranked by token id, as argmax breaks them,
                 so top-k:1 is exact greedy decoding);
  threshold:P    p_i(d_i) >= P;
  typical:EPS    p_i(d_i) > min(EPS, sqrt(EPS) * exp(-H(p_i))), Medusa's typical acceptance (Cai et al. 2024);
and each also accepts the row's own choice (its argmax), so it never rejects what exact greedy decoding would
accept, and never a token p_i rules out (p_i(d_i) = 0: a masked or filtered token). The draft's q plays no part.
After the accepted path, the next token is what the exact rule emits from that row alone: its argmax when
greedy; when sampling, a draw from p_n (the request's generator, or its coupled noise at that depth).
Example (top-k:2, greedy): draft [5, 7, 9], rows 0..2 whose two likeliest tokens are (5, 3), (1, 7), (2, 4),
argmax first -> ([0, 1], 2): 5 and 7 accepted (7 is second at row 1), 9 rejected at row 2, whose argmax 2 is emitted.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from ..config import Acceptance, SamplingConfig
from ..sampling import draw, probs_from_logits
from .tree import tree_children, tree_depths


def acceptable(acceptance: Acceptance, tokens: torch.Tensor, scores: torch.Tensor, probs: torch.Tensor) -> torch.Tensor:
    """Which drafts the rule accepts, each against its own row.

    tokens: (n,) int64 drafts; scores: (n, V), any ranking of each row's tokens that agrees with p (the logits
    when greedy, so that the argmax is exact greedy's choice); probs: (n, V) p of the same rows. Returns (n,) bool.
    """
    rows = torch.arange(tokens.shape[0], device=scores.device)
    tokens = tokens.to(scores.device)
    p_draft = probs[rows, tokens]  # (n,)
    value = acceptance.value
    if value is None:  # exact, whose rule is verify's own
        raise ValueError(f"not a lossy acceptance: {acceptance}")
    if acceptance.mode == "top-k":
        s_draft = scores[rows, tokens].unsqueeze(-1)  # (n, 1)
        earlier = torch.arange(scores.shape[-1], device=scores.device) < tokens.unsqueeze(-1)  # (n, V)
        rank = (scores > s_draft).sum(-1) + ((scores == s_draft) & earlier).sum(-1)  # (n,): 0 for the argmax
        passes = rank < value
    elif acceptance.mode == "threshold":
        passes = p_draft >= value
    elif acceptance.mode == "typical":
        entropy = torch.special.entr(probs).sum(-1)  # (n,) H(p_i) in nats, 0 log 0 = 0
        eps = value
        passes = p_draft > torch.clamp(math.sqrt(eps) * torch.exp(-entropy), max=eps)
    else:
        raise ValueError(f"not a lossy acceptance: {acceptance}")
    return (passes & (p_draft > 0)) | (tokens == scores.argmax(-1))


def lossy_verify(
    tokens: torch.Tensor,
    parents: list[int] | None,
    logits: torch.Tensor,
    sampling: SamplingConfig,
    acceptance: Acceptance,
    generator: torch.Generator | None = None,
    noise: Callable[[list[int]], torch.Tensor] | None = None,
) -> tuple[list[int], int]:
    """(accepted path, next token) under a lossy rule, for a chain (parents None) or a tree of drafts.

    tokens: (k,) drafts; logits: (k + 1, V) the scored rows after penalties and constraint (row i + 1 scores
    draft i's successor; row 0 the root's); sampling, generator, noise: as `verify` takes them. A chain is
    accepted up to its first rejected draft; a tree is walked from the root, taking at each node its most
    probable accepted child (the first in node order on a tie) until none is accepted.
    """
    greedy = sampling.greedy
    probs = logits.float().softmax(-1) if greedy else probs_from_logits(logits, sampling)  # (k + 1, V)
    scores = logits if greedy else probs
    k = tokens.shape[0]
    parents = parents if parents is not None else list(range(-1, k - 1))  # a chain is a tree of one branch
    rows = [p + 1 for p in parents]  # the row that scores each draft: its parent's
    passed = acceptable(acceptance, tokens, scores[rows], probs[rows]).tolist() if k else []
    chance = probs[rows, tokens.to(probs.device)].tolist() if k else []
    kids = tree_children(parents)
    path, node = [], -1
    while True:
        taken = [c for c in kids.get(node, []) if passed[c]]
        if not taken:
            break
        node = max(taken, key=lambda c: chance[c])  # max keeps the first of equals: node order on a tie
        path.append(node)
    return path, _next_token(
        node + 1, tree_depths(parents)[node] if node >= 0 else 0, logits, probs, greedy, generator, noise
    )


def _next_token(
    row: int,
    depth: int,
    logits: torch.Tensor,
    probs: torch.Tensor,
    greedy: bool,
    generator: torch.Generator | None,
    noise: Callable[[list[int]], torch.Tensor] | None,
) -> int:
    """What the exact rule emits from `row` alone (depth: its distance past the context, which fixes its noise)."""
    if greedy:
        return int(logits[row].argmax())
    if noise is not None:  # coupled sampling: argmax(log p + Gumbel noise of that position)
        return int((probs[row].log() + noise([depth])[0].to(probs.device)).argmax())
    return draw(probs[row], generator)
