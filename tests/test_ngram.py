"""Prompt lookup on literal token lists."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from specdec.drafters.base import Budget
from specdec.drafters.lookup.ngram import NgramDrafter, ngram_lookup
from specdec.errors import ConfigError


def lookup(context, k=3, min_n=1, max_n=3):
    return ngram_lookup(np.array(context), k, min_n, max_n).tolist()


def test_proposes_what_followed_the_suffix():
    assert lookup([1, 2, 3, 9, 1, 2], k=3, min_n=2) == [3, 9, 1]


def test_longest_ngram_wins_over_shorter_more_recent_match():
    # suffix [7 1 2]: the 3-gram occurs at 0 (then 5); the 2-gram [1 2] occurs later (then 8)
    assert lookup([7, 1, 2, 5, 0, 1, 2, 8, 7, 1, 2], k=1, max_n=3) == [5]


def test_most_recent_match_among_equal_lengths():
    assert lookup([1, 2, 4, 1, 2, 6, 1, 2], k=1, min_n=2, max_n=2) == [6]


def test_continuation_is_cut_at_k_and_at_context_end():
    assert lookup([5, 6, 7, 8, 5, 6], k=10, min_n=2) == [7, 8, 5, 6]
    assert lookup([4, 4], k=3, min_n=1) == [4]


def test_no_match_proposes_nothing():
    assert lookup([1, 2, 3, 4], min_n=1) == []
    assert lookup([1, 2, 3, 1], min_n=2) == []
    assert lookup([9], min_n=1) == []


def test_drafter_returns_int64_tensor_and_validates_sizes():
    draft = NgramDrafter(min_n=1, max_n=2).propose([3, 4, 3], Budget(2))
    assert draft.tokens.tolist() == [4, 3] and draft.probs is None
    with pytest.raises(ConfigError):
        NgramDrafter(min_n=3, max_n=2)


def reference_lookup(context: np.ndarray, k: int, min_n: int, max_n: int) -> list[int]:
    """The definition, by brute force: every window of n tokens ending before the last one, compared whole."""
    L = len(context)
    for n in range(min(max_n, L - 1), min_n - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(context[: L - 1], n)
        hits = np.flatnonzero((windows == context[L - n:]).all(axis=1))
        if hits.size:
            return context[hits[-1] + n: hits[-1] + n + k].tolist()
    return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 3), max_size=40), st.integers(0, 6), st.integers(1, 4), st.integers(0, 3))
def test_lookup_equals_the_brute_force_definition(tokens, k, min_n, extra):
    context = np.array(tokens, dtype=np.int64)
    assert ngram_lookup(context, k, min_n, min_n + extra).tolist() == reference_lookup(context, k, min_n, min_n + extra)
