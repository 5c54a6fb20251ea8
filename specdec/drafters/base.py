"""The drafter contract: propose tokens, never pick the final one.

A drafter serves one request at a time: begin(request), then each step propose(context, budget) with the whole
context and what the step allows, observe(features) with the target's hidden states of the positions it kept
(drafters that read them), scored(...) with the target's choices at every scored row (drafters that need them), and
at the end learn(output) and end(). Drafters that share drafting passes between requests (the quantized copy, draft
models, EAGLE and Medusa heads on the kernels) declare it with pass_sharing() and draft them with propose_together().
Drafters that sample (draft models) also return q, their distribution at each drafted position, so verification can
accept with min(1, p/q); deterministic drafters return probs=None (q is one-hot). fork() gives another concurrent
request a drafter of its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, NamedTuple

import torch

from ..config import SamplingConfig
from ..costs import CostModel, SharedPasses
from ..models.backend import SequenceCache
from ..sampling import sample
from ..verify import Draft  # what propose returns: defined with the rules that verify it


@dataclass(frozen=True)
class Budget:
    """What one step allows a drafter: at most k positions drafted ahead (a chain's tokens, a tree's depth), and a
    tree or a chain only. Trees are allowed where the request is verified alone: the batched pass scores chains."""

    k: int
    tree: bool = False


@dataclass
class DraftRequest:
    """What a drafter may know about the request it drafts for."""

    prompt_ids: list[int]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generator: torch.Generator | None = None  # the drafter's own random stream (sampling requests)
    noise: Callable[[list[int]], torch.Tensor] | None = None  # coupled mode: (positions) -> (n, V) Gumbel noise
    costs: CostModel | None = None  # the engine's measured verify costs, for drafters that size trees
    adaptive: bool = True  # False: draft the most allowed every step (--no-adaptive), for drafters that decide it
    # the request's KV cache in the target, for drafters that draft on it (the quantized copy): they may write
    # only past its length, where the verify pass writes before anything reads
    target_cache: SequenceCache | None = None

    def draw(self, q: torch.Tensor, position: int) -> int:
        """A draft token from q (V,) for `position`: argmax(log q + that position's noise) in coupled mode,
        else a sample from the drafter's own stream."""
        if self.noise is not None:
            return int((q.log() + self.noise([position])[0].to(q.device)).argmax())
        return int(sample(q.cpu(), self.generator))


def feature_columns(given: tuple[int, ...], wanted: tuple[int, ...], hidden_size: int) -> torch.Tensor:
    """Column indices (H + len(wanted) * H,) that take, from hidden states laid out for feature layers `given` (the
    final state, then each given layer's input, as a target pass returns them), the layout for `wanted` (each of
    them one of `given`): what observe() receives for a drafter that reads `wanted`."""
    H = hidden_size
    blocks = [0] + [1 + given.index(i) for i in wanted]
    return torch.cat([torch.arange(H) + H * block for block in blocks])


def features_in_layout(hidden: torch.Tensor, given: tuple[int, ...], wanted: tuple[int, ...]) -> torch.Tensor:
    """hidden (n, H + len(given) * H), laid out for feature layers `given`, in the layout for `wanted` (each of them
    one of `given`): (n, H + len(wanted) * H)."""
    if given == wanted:
        return hidden
    return hidden[:, feature_columns(given, wanted, hidden.shape[-1] // (1 + len(given)))]


class DraftJob(NamedTuple):
    """One request's part of propose_together: its drafter, its context (prompt + generated so far), and the most
    tokens it drafts."""

    drafter: "Drafter"
    context: list[int]
    k: int


class Drafter(ABC):
    """What every drafter is. Drafters subclass it for the defaults below (propose is theirs to write)."""

    name: str = ""  # its name in the registry; costs and metrics are kept per name
    #: the target's hidden states the drafter reads (observe() receives them): None, none; (), the final hidden
    #: state (m, H); layers (A of them, EAGLE-3), that state followed by the inputs of those target layers
    #: (m, H + A*H). Asked of the target with each pass (CausalLM.forward's feature_layers), set on nothing
    feature_layers: tuple[int, ...] | None = None
    #: True for drafters that read the target's choice at every scored row, rejected drafts included (scored())
    needs_scores: bool = False
    #: who sizes a step's draft where the step allows a tree (alone; in a batch the engine's policy gives k):
    #: "policy", the engine's draft-length policy; "tree", the policy decides whether drafting pays and the drafter
    #: then gets the most drafts allowed and sizes its tree from the measured costs; "drafter", it decides both
    #: (select and lookahead, from their own measurements), and the policy is not asked
    sizing: str = "policy"
    #: the request being drafted for, from begin() on (None before the first)
    request: DraftRequest | None = None

    @property
    def current(self) -> DraftRequest:
        """The request being drafted for, between begin() and end(): what propose and the steps it calls read."""
        if self.request is None:
            raise RuntimeError(f"drafter {self.name!r} drafts for no request: begin() was not called")
        return self.request

    def begin(self, request: DraftRequest) -> None:
        """Starts a new request."""
        self.request = request

    @abstractmethod
    def propose(self, context: list[int], budget: Budget) -> Draft:
        """Up to budget.k tokens to follow `context` (prompt + generated so far); a tree only if budget.tree."""

    def observe(self, features: torch.Tensor) -> None:
        """The target's hidden states (m, H) of the positions it just processed and kept, in order."""

    def scored(self, draft: Draft, choices: torch.Tensor, path: list[int]) -> None:
        """After the step that verified `draft`: the target's greedy choice (1 + len(draft),) int64, on the CPU, at
        the root (row 0) and at every drafted node (row i + 1), rejected ones included, from the logits the step
        verified with (penalties and constraints applied); `path`, the accepted nodes from the root down. For
        drafters that draft from what the target predicts at positions it has not accepted (lookahead decoding)."""

    def learn(self, output: list[int]) -> None:
        """The tokens the target generated for a request that ended, for drafters that learn from past outputs."""

    def end(self) -> None:
        """Ends the request and frees per-request state."""

    def pass_sharing(self) -> SharedPasses | None:
        """The costs of the drafting passes this request shares with other requests' (propose_together), or None
        where it drafts alone: the default."""
        return None

    def propose_together(self, jobs: list["DraftJob"]) -> list[Draft]:
        """Drafts for several requests in shared passes, one job each, where pass_sharing() returned the same
        passes for all of them: one chain of up to k tokens each."""
        raise NotImplementedError(f"drafter {self.name!r} drafts alone")

    def fork(self) -> "Drafter":
        """A fresh drafter for another concurrent request, sharing weights and other heavy state."""
        raise NotImplementedError(f"drafter {self.name!r} cannot serve concurrent requests")
