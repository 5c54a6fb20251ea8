"""Comparing token sequences (the lowest layer: imported by models, drafters, the harness and the benchmark)."""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int], limit: int | None = None) -> int:
    """Length of the longest common prefix of two token lists, at most `limit` (a binary search over slice
    equality, which compares in C: thousands of tokens take microseconds)."""
    lo, hi = 0, min(len(a), len(b), len(a) if limit is None else limit)
    if hi > 0 and a[:hi] == b[:hi]:
        return hi
    while lo < hi:  # a[:lo] == b[:lo]; the answer is at most hi
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (the shorter one's length when one extends the other), or
    None when they are equal."""
    n = common_prefix(a, b)
    return None if n == len(a) == len(b) else n
