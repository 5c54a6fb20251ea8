"""EAGLE drafting: a trained head reads the target's features and drafts a chain or a dynamic tree.

Tree drafting follows EAGLE-2: each level keeps the `width` most probable continuations of the
whole frontier (by cumulative draft log-probability), the head scores a level in one pass with a
tree mask, and the nodes sent to the target are the most probable ones, as many as maximise
expected accepted tokens per second under the measured verify-cost curve. Siblings are
deterministic top-k choices, so sampling verifies them one-hot (verify.tree_rejection_verify).

Trees also hold the prompt-lookup continuation as one more branch. Where that continuation is expected to
be accepted at least as far as the head's recent trees (text the answer copies from the prompt), the
head is skipped and the continuation alone is drafted, as a chain sized by the verify-cost curve.

On the device path (a head on a CUDA device, or device_drafting=True), greedy chains and trees are drafted by
shape-static tensor code over a preallocated head cache (eagle_device.py), captured as CUDA graphs on a GPU
(head_graphs.py), with one host read per step; the true pairs a step accepted are fed to the head as a captured
step too (more than its largest bucket, as the prompt, eagerly). A tree then has every level up to the depth cap,
and the nodes that pay are chosen on the host from the most probable `max_nodes`. Sampled chains, penalized
requests and calibrated trees take the host path, over the same cache.
"""

from __future__ import annotations

import math
from functools import partial

import torch

from ...costs import CostModel
from ...errors import ConfigError
from ...penalties import SubsetPenalties, TokenHistory, inverse_index
from ...sampling import probs_from_logits
from ...tokens import common_prefix
from ..base import Budget, Draft, Drafter, DraftRequest
from .calibration import Calibration, DraftedTree, node_depths
from .eagle3_head import Eagle3Head
from .eagle_device import FeatureRows, HeadCache
from .eagle_head import EagleHead
from .eagle_kernels import KernelEagle3Head, KernelEagleHead
from .head_graphs import FEED_BUCKETS, HeadGraphs
from ..trees import LookupBranch, expand_floor, finish_tree, TreeNodes, level_visibility, path_tokens, tree_width


class EagleDrafter(Drafter):
    name = "eagle"

    def __init__(
        self,
        head: EagleHead | Eagle3Head | KernelEagleHead | KernelEagle3Head,
        tree: bool = True,
        width: int | None = None,
        max_depth: int = 8,
        max_nodes: int = 48,
        lookup: bool = True,
        fixed_size: bool = False,
        name: str = "eagle",
        calibration: Calibration | None = None,
        device_drafting: bool | None = None,
    ):
        """width None: chosen each step from the measured verify-cost curve (tree_width). fixed_size: every tree
        is drafted to the depth cap and holds `max_nodes` nodes (the most probable), whatever the measured costs
        say (the cost model still decides whether to draft at all when adaptive). lookup: trees also hold
        the prompt-lookup continuation (NgramDrafter) as one more branch, for text the answer copies.
        name: the drafter's name (costs, metrics and select's candidates are
        kept per name: "eagle3" for an EAGLE-3 head asked for by that name). calibration: trees are scored and
        sized by the acceptance observed for the head's confidences (calibration.py), shared with forks; None: by
        the raw confidences. device_drafting: draft greedy chains and trees with shape-static tensor code, captured
        as CUDA graphs on a GPU (None: where the head is a torch module on a CUDA device)."""
        self.name = name
        self.calibration = calibration
        if isinstance(head, torch.nn.Module):
            head.eval().requires_grad_(False)
        self.head = head  # an EagleHead or Eagle3Head, or a kernel view of one
        self.device = head.draft_ids.device
        self.draft_ids = head.draft_ids.cpu()  # draft index -> token id, for the host path's choices
        module = isinstance(head, torch.nn.Module)
        self.device_drafting = module and self.device.type == "cuda" if device_drafting is None else device_drafting
        if self.device_drafting and not module:
            raise ConfigError("device drafting needs the EAGLE head as a torch module, not the CPU kernels' view")
        # the head's keys and values of the true pairs, and past them what a step drafts (both paths)
        self.cache = HeadCache(head.config, self.device, head.feature_dtype)
        if self.device_drafting:
            self.graphs = HeadGraphs(head, self.cache, capture=self.device.type == "cuda")
        H, layers = head.config.hidden_size, len(head.feature_layers)
        # observe() gets the final state, then the inputs of the head's feature layers (EAGLE-3 reads those alone)
        self.columns = (torch.arange(H, H + H * layers) if layers else torch.arange(H)).to(self.device)
        self.tree, self.width, self.max_depth, self.max_nodes = tree, width, max_depth, max_nodes
        self.fixed_size = fixed_size
        self.dtype = head.feature_dtype
        self.lookup = lookup
        self.vocab = head.config.vocab_size
        self._inverse: torch.Tensor | None = None  # token id -> draft index, built on first use (penalized requests)
        self._reset()

    def fork(self) -> "EagleDrafter":
        return EagleDrafter(
            self.head,
            self.tree,
            self.width,
            self.max_depth,
            self.max_nodes,
            self.lookup,
            self.fixed_size,
            self.name,
            self.calibration,
            self.device_drafting,
        )

    @property
    def feature_layers(self) -> tuple[int, ...]:  # type: ignore[override]  # Drafter declares a plain attribute
        """The target layers whose inputs the head reads (EAGLE-3); none: the final hidden state (EAGLE-1/2)."""
        return tuple(self.head.feature_layers)

    @property
    def sizing(self) -> str:  # type: ignore[override]  # a property where Drafter declares a plain attribute
        """Tree mode sizes its trees from the measured costs where a step allows a tree; chains take k as given."""
        return "tree" if self.tree else "policy"

    def _reset(self) -> None:
        self.features = FeatureRows(self.head.config.hidden_size, self.device, self.dtype)  # observed, fused (n, H)
        self.cache.length = 0
        self.pair_tokens: list[int] = []  # x_{t+1} of each cached true pair
        self.last_out: torch.Tensor | None = None  # head output at the last true pair: its guess of the next feature
        self.branch = LookupBranch() if self.lookup else None  # the prompt-lookup continuation in trees
        self.penalties: SubsetPenalties | None = None  # the request's penalties at the context being drafted
        self.last_tree: DraftedTree | None = None  # the last tree, for the calibration

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self._reset()

    def end(self) -> None:
        self._reset()

    @property
    def feat(self) -> torch.Tensor:
        """The fused features observed so far (n, H): of every position of the context but the last."""
        return self.features.view()

    @torch.inference_mode()  # as propose: the head cache is written in one mode only
    def observe(self, features: torch.Tensor) -> None:
        """features (m, H + A*H): the target's final state, then the inputs of the head's A feature layers; the
        head reads its columns, fused (m, H)."""
        mine = features.detach().to(self.device)[:, self.columns]  # no copy where they are already there
        self.features.append(self.head.fuse(mine).to(self.dtype))
        if not self.cache.length and self.request is not None:
            self._sync(self.current.prompt_ids)  # the head reads the prompt now, as part of the prefill

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        k = budget.k
        if k <= 0:
            return Draft.empty()
        root = self._sync(context)
        self.penalties = self._penalties(context)
        if self.last_tree is not None and self.calibration is not None:  # which of its nodes the target accepted
            self.last_tree.observed_by(self.calibration, context)
        self.last_tree = None
        on_device = self.device_drafting and self.penalties is None
        if self.tree and budget.tree:
            if on_device and self.calibration is None:
                return self._device_tree(root, context, min(k, self.max_depth))
            return self._tree(root, context, min(k, self.max_depth))
        if on_device and self.current.sampling.greedy:
            return Draft(tokens=self.graphs.chain(root, k).cpu())  # the step's one host read
        return self._chain(root, len(context), k)

    # ---- the head's view of the accepted context ----------------------------------------------------
    def _sync(self, context: list[int]) -> torch.Tensor:
        """Feeds the head the true pairs (f_t, x_{t+1}) it has not seen; returns its output at the last one (H,)."""
        n = min(self.features.rows, len(context) - 1)  # pairs known: features of every position but the last
        want = context[1 : n + 1]
        keep = common_prefix(self.pair_tokens, want)
        self.cache.length = min(self.cache.length, keep)  # rollback
        if self.device_drafting and 0 < n - keep <= FEED_BUCKETS[-1]:  # a step's pairs: a bucketed, captured feed
            self.last_out = self.graphs.feed(self.feat[keep:n], self._on_device(want[keep:n])[0])
        elif keep < n:
            out, new_kv = self.head(
                self.feat[keep:n][None],
                self._on_device(want[keep:n]),
                torch.arange(keep, n, device=self.device)[None],
                past=self.cache.past(),
            )
            self.cache.append(new_kv)
            self.last_out = out[0, -1]
        self.pair_tokens = list(want)
        assert self.last_out is not None  # the prompt's pairs were fed at the prefill (observe)
        return self.last_out

    def _on_device(self, values: list[int]) -> torch.Tensor:
        """(1, n) int64 on the head's device, copied without waiting (a blocking copy synchronises)."""
        return torch.tensor(values)[None].to(self.device, non_blocking=True)

    def _penalties(self, context: list[int]) -> SubsetPenalties | None:
        """The request's penalties over the draft vocabulary at this context, or None where it asks for none."""
        sampling = self.current.sampling
        if not sampling.penalized:
            return None
        if self._inverse is None:
            self._inverse = inverse_index(self.head.draft_ids.cpu(), self.vocab)
        history = TokenHistory.of(self.current.prompt_ids, context, self.vocab)
        return SubsetPenalties(history, self.head.draft_ids.cpu(), self._inverse, sampling)

    def _draft_logits(self, hidden: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """The head's logits over the draft vocabulary (F, K) for hidden (F, H), penalized along each row's path."""
        logits = self.head.draft_logits(hidden).float().cpu()  # the host path chooses on the CPU
        return logits if self.penalties is None else self.penalties.apply(logits, paths)

    def _step(self, features: torch.Tensor, tokens: list[int], positions: list[int], window: int, mask=None):
        """One head pass over T new pairs attending to the cache's first `window` rows (the true pairs, then those
        this step drafted): features (T, H) -> outputs (T, H); their keys and values go to rows [window, window + T),
        past the true pairs, where the next true pairs overwrite them."""
        out, new_kv = self.head(
            features[None],
            self._on_device(tokens),
            self._on_device(positions),
            past=self.cache.window(window),
            mask=None if mask is None else mask.to(self.device, non_blocking=True),
        )
        self.cache.write(window, new_kv)
        return out[0]

    # ---- chains --------------------------------------------------------------------------------------
    def _chain(self, h: torch.Tensor, context_len: int, k: int) -> Draft:
        request = self.current
        sampling = request.sampling
        position = len(self.pair_tokens)  # pair position of the first draft
        window, tokens, rows = self.cache.length, list[int](), []
        for i in range(k):
            logits = self._draft_logits(h[None], [tokens])[0]  # (K,)
            if sampling.greedy:
                token = int(self.draft_ids[int(logits.argmax())])
            else:
                q = torch.zeros(self.vocab).index_copy_(0, self.draft_ids, probs_from_logits(logits, sampling))
                token = request.draw(q, context_len + i)
                rows.append(q)
            tokens.append(token)
            if i < k - 1:
                h = self._step(h[None], [token], [position + i], window)[0]
                window += 1
        return Draft(tokens=torch.tensor(tokens), probs=torch.stack(rows) if rows else None)

    # ---- trees ---------------------------------------------------------------------------------------
    def _tree(self, root: torch.Tensor, context: list[int], depth_cap: int) -> Draft:
        costs = self.current.costs or CostModel()  # unmeasured: the cost model's default curve
        if self.branch is not None and (copied := self.branch.start(context, depth_cap, costs)) is not None:
            return copied
        n_true = len(self.pair_tokens)
        width = self.width or tree_width(costs)
        nodes = TreeNodes()
        tokens, parents, scores = nodes.tokens, nodes.parents, nodes.scores
        hidden_of: dict[int, torch.Tensor] = {-1: root}
        fed: list[int] = []  # nodes with head keys, in kv order after the true pairs
        frontier = [-1]
        window = self.cache.length  # the true pairs, then the levels fed so far
        floor = 0.0 if self.fixed_size else expand_floor(costs)
        for depth in range(1, depth_cap + 1):
            # the whole frontier's draft distributions in one product: (F, K)
            paths = [path_tokens(n, tokens, parents) for n in frontier]
            logits = self._draft_logits(torch.stack([hidden_of[n] for n in frontier]), paths)
            calibrated = None if self.calibration is None else partial(self.calibration.log_probability, depth)
            frontier = nodes.grow(frontier, logits, width, self.draft_ids, calibrated)
            if depth == depth_cap or math.exp(scores[frontier[0]]) < floor:
                break
            # one head pass for the new level: node i's pair is (its parent's output, its token)
            feats = torch.stack([hidden_of[parents[i]] for i in frontier])
            visible = level_visibility(frontier, parents, n_true, fed)
            out = self._step(
                feats, [tokens[i] for i in frontier], [n_true + depth - 1] * len(frontier), window, visible[None, None]
            )
            window += len(frontier)
            for r, node in enumerate(frontier):
                hidden_of[node] = out[r]
            fed += frontier
        draft = finish_tree(
            tokens, parents, node_depths(parents), scores, costs, self.max_nodes, self.branch, self.fixed_size
        )
        if self.calibration is not None:
            self.last_tree = DraftedTree.of(len(context), draft, tokens, parents, nodes.probs)
        return draft

    def _device_tree(self, root: torch.Tensor, context: list[int], depth_cap: int) -> Draft:
        """A tree drafted on the device (every level up to depth_cap), then sized on the host as _tree's is."""
        costs = self.current.costs or CostModel()
        if self.branch is not None and (copied := self.branch.start(context, depth_cap, costs)) is not None:
            return copied
        width = min(self.width or tree_width(costs), self.head.config.draft_vocab_size)
        tokens, parents, scores = self.graphs.tree(root, depth_cap, width, self.max_nodes)
        values = torch.stack([tokens.double(), parents.double(), scores.double()]).tolist()  # the one host read
        tokens, parents = [int(t) for t in values[0]], [int(p) for p in values[1]]
        return finish_tree(
            tokens, parents, node_depths(parents), values[2], costs, self.max_nodes, self.branch, self.fixed_size
        )
