"""Prompt lookup: find the context's latest earlier occurrence of its own last n tokens, propose what followed."""

from __future__ import annotations

import numpy as np
import torch

from ..base import Budget, Draft, Drafter
from ..options import NgramOptions


def ngram_lookup(context: np.ndarray, k: int, min_n: int, max_n: int) -> np.ndarray:
    """Continuation of the longest suffix n-gram (max_n down to min_n) found earlier in the context.

    Among matches of the longest n, the most recent one wins. Returns up to k tokens, possibly none.
    Example: context [1 2 3 9 1 2], k 3, n 2 -> the suffix [1 2] occurred at 0; proposes [3 9 1].
    """
    L = context.shape[0]
    if L < 2:
        return context[:0]
    # positions where a match of the last n tokens ends; each longer match is one of the shorter ones
    hits = np.flatnonzero(context[: L - 1] == context[L - 1])
    longest = None
    for n in range(1, min(max_n, L - 1) + 1):
        if n > 1:
            hits = hits[hits >= n - 1]
            hits = hits[context[hits - (n - 1)] == context[L - n]]
        if not hits.size:
            break
        if n >= min_n:
            longest = hits
    if longest is not None:
        start = int(longest[-1]) + 1
        return context[start : start + k]
    return context[:0]


class NgramDrafter(Drafter):
    """Deterministic drafter (q one-hot); costs microseconds, pays where output repeats the context."""

    name = "ngram"

    def __init__(self, min_n: int = 2, max_n: int = 4):
        NgramOptions(min_n, max_n)  # refuses sizes out of range
        self.min_n, self.max_n = min_n, max_n

    def fork(self) -> "NgramDrafter":
        return NgramDrafter(self.min_n, self.max_n)

    def propose(self, context: list[int], budget: Budget) -> Draft:
        tokens = ngram_lookup(np.asarray(context, dtype=np.int64), budget.k, self.min_n, self.max_n)
        return Draft(tokens=torch.from_numpy(tokens.copy()))
