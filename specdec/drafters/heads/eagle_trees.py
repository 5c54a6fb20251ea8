"""EAGLE-2 trees: drafted level by level on the host (each level the `width` most probable continuations of the
whole frontier, scored in one head pass under a tree mask), or every level on the device, then sized on the host;
the nodes sent to the target are as many as maximise expected accepted tokens per second under the measured
verify-cost curve (trees.finish_tree)."""

from __future__ import annotations

import math
from functools import partial
from typing import Any, Protocol

import torch

from ...costs import CostModel
from ..base import Draft, DraftRequest
from ..trees import LookupBranch, TreeNodes, expand_floor, finish_tree, level_visibility, path_tokens, tree_width
from .calibration import Calibration, DraftedTree, node_depths
from .eagle_device import HeadCache


class TreeDrafter(Protocol):
    """What drafting a tree reads and writes of its drafter (an EagleDrafter)."""

    head: Any
    graphs: Any  # its HeadGraphs, where it drafts on the device
    cache: HeadCache
    pair_tokens: list[int]
    draft_ids: torch.Tensor
    branch: LookupBranch | None
    calibration: Calibration | None
    last_tree: DraftedTree | None
    width: int | None
    max_nodes: int
    fixed_size: bool

    @property
    def current(self) -> DraftRequest: ...

    def draft_logits(self, hidden: torch.Tensor, paths: list[list[int]]) -> torch.Tensor: ...

    def head_step(self, features: torch.Tensor, tokens: list[int], positions: list[int], window: int, mask=None): ...


def host_tree(drafter: TreeDrafter, root: torch.Tensor, context: list[int], depth_cap: int) -> Draft:
    """A dynamic tree (EAGLE-2) drafted level by level on the host, or the prompt-lookup continuation alone where
    it is expected to go as far (the drafter's LookupBranch), sized by the measured costs."""
    costs = drafter.current.costs or CostModel()  # unmeasured: the cost model's default curve
    if drafter.branch is not None and (copied := drafter.branch.start(context, depth_cap, costs)) is not None:
        return copied
    n_true = len(drafter.pair_tokens)
    width = drafter.width or tree_width(costs)
    nodes = TreeNodes()
    tokens, parents, scores = nodes.tokens, nodes.parents, nodes.scores
    hidden_of: dict[int, torch.Tensor] = {-1: root}
    fed: list[int] = []  # nodes with head keys, in kv order after the true pairs
    frontier = [-1]
    window = drafter.cache.length  # the true pairs, then the levels fed so far
    floor = 0.0 if drafter.fixed_size else expand_floor(costs)
    for depth in range(1, depth_cap + 1):
        # the whole frontier's draft distributions in one product: (F, K)
        paths = [path_tokens(n, tokens, parents) for n in frontier]
        logits = drafter.draft_logits(torch.stack([hidden_of[n] for n in frontier]), paths)
        calibrated = None if drafter.calibration is None else partial(drafter.calibration.log_probability, depth)
        frontier = nodes.grow(frontier, logits, width, drafter.draft_ids, calibrated)
        if depth == depth_cap or math.exp(scores[frontier[0]]) < floor:
            break
        # one head pass for the new level: node i's pair is (its parent's output, its token)
        feats = torch.stack([hidden_of[parents[i]] for i in frontier])
        visible = level_visibility(frontier, parents, n_true, fed)
        out = drafter.head_step(
            feats, [tokens[i] for i in frontier], [n_true + depth - 1] * len(frontier), window, visible[None, None]
        )
        window += len(frontier)
        for r, node in enumerate(frontier):
            hidden_of[node] = out[r]
        fed += frontier
    draft = finish_tree(
        tokens, parents, node_depths(parents), scores, costs, drafter.max_nodes, drafter.branch, drafter.fixed_size
    )
    if drafter.calibration is not None:
        drafter.last_tree = DraftedTree.of(len(context), draft, tokens, parents, nodes.probs)
    return draft


def device_tree(drafter: TreeDrafter, root: torch.Tensor, context: list[int], depth_cap: int) -> Draft:
    """A tree drafted on the device (every level up to depth_cap), then sized on the host as host_tree's is."""
    costs = drafter.current.costs or CostModel()
    if drafter.branch is not None and (copied := drafter.branch.start(context, depth_cap, costs)) is not None:
        return copied
    width = min(drafter.width or tree_width(costs), drafter.head.config.draft_vocab_size)
    tokens, parents, scores = drafter.graphs.tree(root, depth_cap, width, drafter.max_nodes)
    values = torch.stack([tokens.double(), parents.double(), scores.double()]).tolist()  # the one host read
    tokens, parents = [int(t) for t in values[0]], [int(p) for p in values[1]]
    return finish_tree(
        tokens, parents, node_depths(parents), values[2], costs, drafter.max_nodes, drafter.branch, drafter.fixed_size
    )
