"""Medusa drafting: the heads read the target's last kept feature and guess the next tokens in one pass.

The feature f_t of the last position the target scored gave the context's last token x_{t+1}; head d guesses
x_{t+1+d}. A chain takes each head's best token (or the prompt-lookup continuation where that is expected to go
further; or, sampling, a draw from each head); a tree combines each head's `width` best tokens, most probable
paths first (by the product of the heads' probabilities, the heads being independent), and keeps as many nodes as pay under the measured verify-cost curve (trees.finish_tree), with the
prompt-lookup continuation as one more branch. Siblings are deterministic top-k choices, so sampling verifies
trees one-hot (verify.tree_rejection_verify), and chains with the heads' distributions as q: the output is the
target's either way. Heads on a CUDA device (or device_drafting=True) choose their greedy tokens and tree candidates
in one captured step (medusa_device.py), read back at once; sampled chains read every head's distribution.
"""

from __future__ import annotations

import heapq
import time
from typing import cast

import torch

from ...costs import CostModel, SharedPasses, time_by_size
from ...errors import ConfigError
from ...sampling import probs_from_logits
from ..base import Budget, Draft, Drafter, DraftJob
from .medusa_device import MedusaGraphs
from .medusa_head import MedusaHeads
from .medusa_kernels import KernelMedusaHeads
from ..trees import LookupBranch, finish_tree, tree_width


class MedusaDrafter(Drafter):
    name = "medusa"
    feature_layers = ()  # the final hidden state

    def __init__(
        self,
        heads: MedusaHeads | KernelMedusaHeads,
        tree: bool = True,
        width: int | None = None,
        max_nodes: int = 48,
        lookup: bool = True,
        fixed_size: bool = False,
        device_drafting: bool | None = None,
        shared: list[SharedPasses] | None = None,
    ):
        """width None: candidates per head chosen each step from the verify-cost curve (trees.tree_width).
        fixed_size: every tree holds `max_nodes` nodes (the most probable), whatever the measured costs say.
        lookup: trees also hold the prompt-lookup continuation as one more branch. device_drafting: greedy chains and
        trees take their candidates from one shape-static step (None: where the heads are on a CUDA device). shared:
        the heads' pass costs by rows for chains drafted together (pass_sharing), shared by every fork."""
        self.shared = shared if shared is not None else []
        if isinstance(heads, torch.nn.Module):
            heads.eval().requires_grad_(False)
        self.heads = heads  # MedusaHeads, or its KernelMedusaHeads view
        self.tree, self.width, self.max_nodes, self.lookup = tree, width, max_nodes, lookup
        self.fixed_size = fixed_size
        self.vocab = heads.config.vocab_size
        device, module = heads.draft_ids.device, isinstance(heads, torch.nn.Module)
        self.device_drafting = module and device.type == "cuda" if device_drafting is None else device_drafting
        if self.device_drafting and not module:
            raise ConfigError("device drafting needs the Medusa heads as a torch module, not the CPU kernels' view")
        self.graphs = MedusaGraphs(heads, capture=device.type == "cuda") if self.device_drafting else None
        self._reset()

    def fork(self) -> "MedusaDrafter":
        fork = MedusaDrafter(
            self.heads, self.tree, self.width, self.max_nodes, self.lookup, self.fixed_size, False, self.shared
        )
        fork.device_drafting, fork.graphs = self.device_drafting, self.graphs  # no per-request state: shared
        return fork

    @property
    def sizing(self) -> str:  # type: ignore[override]  # a property where Drafter declares a plain attribute
        """Tree mode sizes its trees from the measured costs where a step allows a tree; chains take k as given."""
        return "tree" if self.tree else "policy"

    def _reset(self) -> None:
        self.seen = 0  # positions whose features arrived
        self.last: torch.Tensor | None = None  # the latest of them (H,)
        self.branch = LookupBranch() if self.lookup else None

    def begin(self, request) -> None:
        super().begin(request)
        self._reset()

    def end(self) -> None:
        self._reset()

    def observe(self, features: torch.Tensor) -> None:
        if features.shape[0]:
            self.seen += features.shape[0]
            self.last = features[-1, : self.heads.config.hidden_size].detach()  # the final state (feature_layers)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        k, tree = budget.k, self.tree and budget.tree
        if (made := self._before_heads(context, k, tree)) is not None:
            return made
        assert self.last is not None  # _before_heads drafts nothing where the feature is not known
        request = self.current
        costs = request.costs or CostModel()  # unmeasured: the cost model's default curve
        depth = min(k, self.heads.config.num_heads)
        heads = self.heads
        f = self.last.to(heads.draft_ids.device, heads.feature_dtype)
        if self.device_drafting and self.graphs is not None and (tree or request.sampling.greedy):
            width = min(self.width or tree_width(costs), len(heads.draft_ids)) if tree else 1
            logp, ids = self.graphs.top(f, depth, width)  # (depth, width) each, the step's one host read
            return (
                self._tree_of(logp, ids, costs)
                if tree
                else self._greedy_chain([row[0] for row in logp], [row[0] for row in ids])
            )
        logits = heads.draft_logits(heads(f[None]))[0, :depth].float().cpu()  # (depth, K)
        if tree:
            return self._tree(logits, costs)
        return self._chain(logits, len(context))

    def pass_sharing(self) -> SharedPasses | None:
        """The heads' pass costs by rows where this request drafts its chain in a pass shared with other requests'
        (a greedy request without penalties, the heads on the CPU kernels: propose_together), else None."""
        sampling = self.current.sampling if self.request is not None else None
        if not isinstance(self.heads, KernelMedusaHeads) or sampling is None or not sampling.greedy:
            return None
        if sampling.penalized:
            return None
        if not self.shared:
            self.shared.append(SharedPasses(time_heads_passes(self.heads)))
        return self.shared[0]

    @torch.inference_mode()
    def propose_together(self, jobs: list[DraftJob]) -> list[Draft]:
        """Greedy chains for requests whose drafters share these heads (pass_sharing): the heads run once over every
        request that needs them (rows are independent: each gets the chain propose drafts for it)."""
        drafts: dict[int, Draft] = {}
        running = []  # (job index, drafter, depth) of the requests the heads draft for
        for i, (job_drafter, context, k) in enumerate(jobs):
            drafter = cast(MedusaDrafter, job_drafter)  # pass_sharing groups these heads' drafters only
            if (made := drafter._before_heads(context, k, tree=False)) is not None:
                drafts[i] = made
            else:
                running.append((i, drafter, min(k, self.heads.config.num_heads)))
        if running:
            start = time.perf_counter()
            features = torch.stack([cast(torch.Tensor, drafter.last).float() for _, drafter, _ in running])
            logits = self.heads.draft_logits(self.heads(features)).float().cpu()  # (B, heads, K)
            for (i, drafter, depth), rows in zip(running, logits):
                drafts[i] = drafter._chain(rows[:depth], len(jobs[i].context))
            self.shared[0].observe(len(running), time.perf_counter() - start)
        return [drafts[i] for i in range(len(jobs))]

    def _before_heads(self, context: list[int], k: int, tree: bool) -> Draft | None:
        """The draft made without running the heads, or None where they run: none where the feature that gave the
        context's last token is not known, or the prompt-lookup continuation alone where it is trusted (trees hold
        it, greedy chains may be it)."""
        if k <= 0 or self.last is None or self.seen != len(context) - 1:
            return Draft.empty()
        if self.branch is not None and (tree or self.current.sampling.greedy):
            return self.branch.start(context, k, self.current.costs or CostModel())
        return None

    def _chain(self, logits: torch.Tensor, context_len: int) -> Draft:
        """Each head's best token (greedy), or a draw from each head's distribution (sampling)."""
        request, draft_ids = self.current, self.heads.draft_ids.cpu()
        if request.sampling.greedy:
            best = torch.log_softmax(logits, -1).max(-1)
            return self._greedy_chain(best.values.tolist(), draft_ids[best.indices].tolist())
        tokens: list[int] = []
        rows = []
        for i, row in enumerate(logits):
            q = torch.zeros(self.vocab).index_copy_(0, draft_ids, probs_from_logits(row, request.sampling))
            tokens.append(request.draw(q, context_len + i))
            rows.append(q)
        return Draft(tokens=torch.tensor(tokens), probs=torch.stack(rows))

    def _greedy_chain(self, log_probs: list[float], ids: list[int]) -> Draft:
        """The chain of each head's best token (ids), its log-probability in log_probs."""
        if self.branch is not None:
            self.branch.head_drafted(float(torch.tensor(log_probs).exp().cumprod(0).sum()))
        return Draft(tokens=torch.tensor(ids, dtype=torch.long))

    def _tree(self, logits: torch.Tensor, costs: CostModel) -> Draft:
        width = min(self.width or tree_width(costs), logits.shape[1])
        top = torch.topk(torch.log_softmax(logits, -1), width, dim=-1)
        return self._tree_of(top.values.tolist(), self.heads.draft_ids.cpu()[top.indices].tolist(), costs)

    def _tree_of(self, logp: list[list[float]], ids: list[list[int]], costs: CostModel) -> Draft:
        """The tree of each head's candidates (token ids `ids`, log-probs `logp`: depth lists of width each) whose
        paths are most probable, sized by the costs."""
        depth, width = len(logp), len(logp[0])
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        scores: list[float] = []
        frontier = [(-logp[0][r], -1, 1, r) for r in range(width)]  # (-score, parent node, depth, rank): a heap
        heapq.heapify(frontier)
        while frontier and len(tokens) < self.max_nodes:  # most probable first: ancestors come before descendants
            negative, parent, d, r = heapq.heappop(frontier)
            tokens.append(ids[d - 1][r])
            parents.append(parent)
            depths.append(d)
            scores.append(-negative)
            if d < depth:
                node = len(tokens) - 1
                for r2 in range(width):
                    heapq.heappush(frontier, (negative - logp[d][r2], node, d + 1, r2))
        return finish_tree(tokens, parents, depths, scores, costs, self.max_nodes, self.branch, self.fixed_size)


@torch.inference_mode()
def time_heads_passes(heads: KernelMedusaHeads, sizes=(1, 2, 4, 8, 16), repeats: int = 3) -> dict[int, float]:
    """{rows: seconds} of the heads and their draft logits over that many random features (time_by_size)."""
    features = {rows: torch.randn(rows, heads.config.hidden_size) for rows in sizes}
    return time_by_size(lambda rows: heads.draft_logits(heads(features[rows])), lambda _rows: None, sizes, repeats)
