"""Draft trees without a model: a tree's attention mask and depths, greedy verification walking its matching branch,
the width and the nodes chosen from the verify-cost curve (or a fixed size), the checked tree options, and the
prompt-lookup path joined into a tree with the record of how often it was accepted."""
import pytest
import torch

from specdec.drafters.trees import choose_nodes
from specdec.verify import tree_depths, tree_greedy_verify, tree_mask


def test_tree_mask_and_depths():
    parents = [-1, -1, 0, 2, 1]  # a, b under the root; c under a; d under c; e under b
    m = tree_mask(parents)
    assert m.tolist() == [[1, 0, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0],
                          [1, 0, 1, 0, 0, 0],
                          [1, 1, 0, 1, 0, 0],
                          [1, 1, 0, 1, 1, 0],
                          [1, 0, 1, 0, 0, 1]]
    assert tree_depths(parents) == [1, 1, 2, 3, 2]


def test_tree_greedy_verify_walks_the_matching_branch():
    tokens = torch.tensor([5, 7, 8, 9, 3])
    parents = [-1, -1, 1, 2, 1]  # 5 and 7 under the root; 8 and 3 under 7; 9 under 8
    logits = torch.zeros(6, 10)
    for row, best in enumerate([7, 0, 8, 9, 4, 0]):  # root -> 7, node 1 -> 8, node 2 -> 9, node 3 -> 4
        logits[row, best] = 1.0
    assert tree_greedy_verify(tokens, parents, logits) == ([1, 2, 3], 4)


def test_tree_width_follows_the_cost_curve():
    from specdec.costs import CostModel
    from specdec.drafters.trees import tree_width

    assert tree_width(CostModel({1: 0.010, 64: 0.0105})) == 8  # flat (memory-bound) verify: wide trees
    assert tree_width(CostModel({1: 0.010, 2: 0.011, 4: 0.013, 8: 0.025})) == 2  # compute-bound: narrow


def test_node_choice_follows_the_cost_curve():
    from specdec.costs import CostModel

    scores = [-0.1, -0.2, -0.3, -2.0, -0.4, -5.0]
    parents = [-1, 0, 1, -1, 2, 3]
    flat = CostModel({1: 0.010, 8: 0.0101, 16: 0.0102})
    steep = CostModel({1: 0.010, 2: 0.020, 8: 0.080})
    assert len(choose_nodes(scores, parents, flat, 48)) == 6
    assert choose_nodes(scores, parents, steep, 48) == []
    chosen = choose_nodes(scores, parents, CostModel({1: 0.010, 4: 0.012, 8: 0.030}), 48)
    assert all(parents[i] < 0 or parents[i] in chosen for i in chosen)  # closed under ancestors


def test_fixed_size_node_choice_ignores_the_costs():
    from specdec.costs import CostModel

    scores = [-0.1, -0.2, -0.3, -2.0, -0.4, -5.0]
    parents = [-1, 0, 1, -1, 2, 3]
    steep = CostModel({1: 0.010, 2: 0.020, 8: 0.080})
    assert choose_nodes(scores, parents, steep, 4, fixed_size=True) == [0, 1, 2, 4]  # the 4 most probable
    assert choose_nodes(scores, parents, steep, 48, fixed_size=True) == list(range(6))


def test_tree_shape_options_are_checked():
    from specdec.drafters.options import TreeOptions
    from specdec.errors import ConfigError

    assert TreeOptions().shape() == {}
    assert TreeOptions(tree_width=3, tree_nodes=10).shape() == {"width": 3, "max_nodes": 10, "fixed_size": True}
    for bad in ({"tree_width": 0}, {"tree_nodes": -1}, {"tree_nodes": 2.5}, {"tree_width": True}):
        with pytest.raises(ConfigError, match="must be an integer >= 1"):
            TreeOptions(**bad)


def test_lookup_path_joins_the_tree_through_matching_nodes():
    from specdec.drafters.trees import add_path

    tokens, parents, depths, scores = [5, 6, 7], [-1, -1, 0], [1, 1, 2], [-0.1, -0.5, -0.3]
    chosen = add_path([0, 1, 2], [5, 7, 9, 9], tokens, parents, depths, scores)
    # 5 and 5->7 are reused; 9 and 9 are new nodes under 7, at depths 3 and 4, ranked last
    assert chosen == [0, 1, 2, 3, 4]
    assert tokens[3:] == [9, 9] and parents[3:] == [2, 3] and depths[3:] == [3, 4]
    assert scores[3] == float("-inf")
    # a path through an unchosen node does not reuse it: siblings among the chosen stay distinct
    tokens, parents, depths, scores = [5, 6], [-1, -1], [1, 1], [-0.1, -0.5]
    assert add_path([0], [6], tokens, parents, depths, scores) == [0, 2]
    assert tokens[2] == 6 and parents[2] == -1


def test_lookup_record_scores_what_was_accepted():
    from specdec.costs import CostModel
    from specdec.drafters.trees import LookupRecord

    record = LookupRecord()
    assert record.rate() == 0.5  # no evidence yet
    record.proposed([1] * 10, [6, 7, 8])
    record.score([1] * 10 + [6, 7, 9, 4])  # two accepted, the third rejected
    assert (record.accepted, record.trials) == (2, 3)
    record.proposed([1] * 14, [5, 5])
    record.score([1] * 14 + [5, 5, 2])  # both accepted (then the bonus token)
    assert (record.accepted, record.trials) == (4, 5)
    record.score([1] * 20)  # nothing pending: nothing changes
    assert record.rate() == 5 / 7
    assert record.expected([0, 0]) == pytest.approx(5 / 7 + (5 / 7) ** 2)
    chain = [0] * 8
    assert record.best_length(chain, CostModel({1: 0.01, 64: 0.0101})) == 8  # flat verify cost: all of it
    assert record.best_length(chain, CostModel({1: 0.01, 2: 0.02, 8: 0.08})) == 1  # steep: the first token
