"""Greedy verification on the device (verify/device.py) gives exactly what the host rules give, chains and trees
(run here on CPU tensors; tests/test_cuda_graphs.py runs them on a GPU and counts the host synchronisations)."""
import torch
from hypothesis import given, settings, strategies as st

from specdec.verify import _longest_match, greedy_verify, tree_greedy_verify
from specdec.verify.device import chain_greedy_on_device, tree_greedy_on_device
from specdec.verify.tree import tree_walk

SMALL = st.integers(0, 3)  # a small vocabulary: matches, mismatches and equal siblings are all common


@st.composite
def chains(draw):
    k = draw(st.integers(0, 12))
    return draw(st.lists(SMALL, min_size=k, max_size=k)), draw(st.lists(SMALL, min_size=k + 1, max_size=k + 1))


@st.composite
def trees(draw):
    n = draw(st.integers(0, 16))
    parents = [draw(st.integers(-1, i - 1)) for i in range(n)]
    return parents, draw(st.lists(SMALL, min_size=n, max_size=n)), draw(st.lists(SMALL, min_size=n + 1, max_size=n + 1))


@settings(max_examples=400, deadline=None)
@given(chains())
def test_chain_on_device_is_the_longest_match(chain):
    draft, choice = chain
    want = _longest_match(torch.tensor(draft, dtype=torch.long), torch.tensor(choice))
    assert chain_greedy_on_device(torch.tensor(draft, dtype=torch.long), torch.tensor(choice)) == want


@settings(max_examples=400, deadline=None)
@given(trees())
def test_tree_on_device_is_the_walk_down_the_first_matching_children(tree):
    parents, tokens, choice = tree
    want = tree_walk(tokens, parents, choice)
    assert tree_greedy_on_device(torch.tensor(tokens, dtype=torch.long), parents, torch.tensor(choice)) == want


def test_the_cpu_keeps_the_host_rules():
    """On the CPU greedy_verify and tree_greedy_verify take the host path; its results are the examples'."""
    logits = torch.full((4, 10), -1.0)
    logits[[0, 1, 2, 3], [5, 7, 2, 4]] = 1.0
    assert greedy_verify(torch.tensor([5, 7, 9]), logits) == (2, 2)
    tree_logits = torch.full((6, 10), -1.0)
    tree_logits[[0, 2, 3, 4], [7, 8, 9, 1]] = 1.0  # root -> 7; under 7 -> 8; under 8 -> 9; under 9 -> 1
    assert tree_greedy_verify(torch.tensor([5, 7, 8, 9, 3]), [-1, -1, 1, 2, 1], tree_logits) == ([1, 2, 3], 1)
