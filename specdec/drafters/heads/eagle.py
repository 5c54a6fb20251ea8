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

In a batch, the greedy chains of requests whose head runs on the CPU kernels are drafted together, one head pass a
drafted token for all of them (pass_sharing, propose_together: eagle_batch.py).
"""

from __future__ import annotations

import torch

from ...costs import SharedPasses
from ...errors import ConfigError
from ...penalties import SubsetPenalties, TokenHistory, inverse_index
from ...sampling import probs_from_logits
from ...tokens import common_prefix
from ..base import Budget, Draft, Drafter, DraftJob, DraftRequest
from .calibration import Calibration, DraftedTree
from .eagle3_head import Eagle3Head
from .eagle_device import FeatureRows, HeadCache
from .eagle_head import EagleHead
from .eagle_batch import draft_chains_together, time_head_passes
from .eagle_kernels import KernelEagle3Head, KernelEagleHead, KernelHeadLayer
from .head_graphs import FEED_BUCKETS, HeadGraphs
from .eagle_trees import device_tree, host_tree
from ..trees import LookupBranch


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
        shared: list[SharedPasses] | None = None,
    ):
        """width None: chosen each step from the measured verify-cost curve (tree_width). fixed_size: every tree
        is drafted to the depth cap and holds `max_nodes` nodes (the most probable), whatever the measured costs
        say (the cost model still decides whether to draft at all when adaptive). lookup: trees also hold
        the prompt-lookup continuation (NgramDrafter) as one more branch, for text the answer copies.
        name: the drafter's name (costs, metrics and select's candidates are
        kept per name: "eagle3" for an EAGLE-3 head asked for by that name). calibration: trees are scored and
        sized by the acceptance observed for the head's confidences (calibration.py), shared with forks; None: by
        the raw confidences. device_drafting: draft greedy chains and trees with shape-static tensor code, captured
        as CUDA graphs on a GPU (None: where the head is a torch module on a CUDA device). shared: the head's pass
        costs by rows for chains drafted together (pass_sharing), shared by every fork, measured when a batch first
        drafts."""
        self.name = name
        self.shared = shared if shared is not None else []
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
        self.columns = slice(H, H + H * layers) if layers else slice(0, H)  # a view of each row, not a copy
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
            self.shared,
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
        head reads its columns, fused (m, H). The prompt's pairs are fed with its prefill, once the last of its
        features arrive (a chunked prompt's last chunk): a step's drafting time, which the policy weighs, is then the
        step's own. Later pairs are fed when a step drafts (_sync): steps that draft nothing run no head pass."""
        mine = features.detach().to(self.device)[:, self.columns]  # no copy where they are already there
        self.features.append(self.head.fuse(mine).to(self.dtype))
        if self.request is not None and self.features.rows == len(self.current.prompt_ids):
            self._sync(self.current.prompt_ids)

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        k = budget.k
        if k <= 0:
            return Draft.empty()
        root = self.start_step(context)
        on_device = self.device_drafting and self.penalties is None
        if self.tree and budget.tree:
            if on_device and self.calibration is None:
                return device_tree(self, root, context, min(k, self.max_depth))
            return host_tree(self, root, context, min(k, self.max_depth))
        if on_device and self.current.sampling.greedy:
            return Draft(tokens=self.graphs.chain(root, k).cpu())  # the step's one host read
        return self._chain(root, len(context), k)

    def start_step(self, context: list[int]) -> torch.Tensor:
        """A step's start: the head fed the pairs it has not seen (_sync), then the step's bookkeeping (begun).
        Returns the head's output at the last pair (H,)."""
        root = self._sync(context)
        self.begun(context)
        return root

    def begun(self, context: list[int]) -> None:
        """After the head has seen every pair of `context`: the request's penalties at it, and the last tree's
        accepted nodes given to the calibration."""
        self.penalties = self._penalties(context)
        if self.last_tree is not None and self.calibration is not None:  # which of its nodes the target accepted
            self.last_tree.observed_by(self.calibration, context)
        self.last_tree = None

    def pass_sharing(self) -> SharedPasses | None:
        """The head's pass costs by rows where this request drafts its chains in passes shared with other requests'
        (a greedy request without penalties, the head on the CPU kernels: propose_together), else None."""
        sampling = self.current.sampling if self.request is not None else None
        if not isinstance(self.head, KernelHeadLayer) or sampling is None or not sampling.greedy or sampling.penalized:
            return None
        if not self.shared:
            self.shared.append(SharedPasses(time_head_passes(self.head)))
        return self.shared[0]

    def propose_together(self, jobs: list[DraftJob]) -> list[Draft]:
        """Chains for requests whose drafters share this head (pass_sharing), one head pass a drafted token for all
        of them (eagle_batch.draft_chains_together): each gets the chain propose would draft for it."""
        return draft_chains_together(jobs, self.shared[0])

    # ---- the head's view of the accepted context ----------------------------------------------------
    def _sync(self, context: list[int]) -> torch.Tensor:
        """Feeds the head the true pairs (f_t, x_{t+1}) it has not seen; returns its output at the last one (H,)."""
        keep, want = self.unseen(context)
        n = len(want)
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
        return self.fed(want)

    def unseen(self, context: list[int]) -> tuple[int, list[int]]:
        """(keep, want): the head cache rolled back to the `keep` true pairs it shares with `context`, whose pairs'
        tokens x_{t+1} are `want` (features are known for every position but the last); pairs keep.. are to feed."""
        n = min(self.features.rows, len(context) - 1)
        want = context[1 : n + 1]
        keep = common_prefix(self.pair_tokens, want)
        self.cache.length = min(self.cache.length, keep)  # rollback
        return keep, want

    def fed(self, want: list[int]) -> torch.Tensor:
        """After the pairs `want` (unseen's) were fed: the head's output at the last of them (H,)."""
        self.pair_tokens = list(want)
        assert self.last_out is not None  # fed at the prefill (observe), or now: a context of two tokens has a pair
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

    def draft_logits(self, hidden: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """The head's logits over the draft vocabulary (F, K) for hidden (F, H), penalized along each row's path."""
        logits = self.head.draft_logits(hidden).float().cpu()  # the host path chooses on the CPU
        return logits if self.penalties is None else self.penalties.apply(logits, paths)

    def head_step(self, features: torch.Tensor, tokens: list[int], positions: list[int], window: int, mask=None):
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
            logits = self.draft_logits(h[None], [tokens])[0]  # (K,)
            if sampling.greedy:
                token = int(self.draft_ids[int(logits.argmax())])
            else:
                q = torch.zeros(self.vocab).index_copy_(0, self.draft_ids, probs_from_logits(logits, sampling))
                token = request.draw(q, context_len + i)
                rows.append(q)
            tokens.append(token)
            if i < k - 1:
                h = self.head_step(h[None], [token], [position + i], window)[0]
                window += 1
        return Draft(tokens=torch.tensor(tokens), probs=torch.stack(rows) if rows else None)
