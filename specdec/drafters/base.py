"""The drafter contract: propose tokens, never pick the final one.

A drafter sees the whole context each step and proposes up to k tokens to follow it. Drafters that
sample (draft models) also return q, their distribution at each drafted position, so verification
can accept with min(1, p/q); deterministic drafters return probs=None (q is one-hot).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable

import torch

from ..config import SamplingConfig
from ..sampling import sample
from ..verify import tree_depths


@dataclass
class Draft:
    tokens: torch.Tensor  # (k,) int64, on the CPU
    probs: torch.Tensor | None = None  # (k, V) q over the target's vocabulary, or None (one-hot); chains only
    parents: list[int] | None = None  # a tree: parents[i] < i, -1 under the root; None for a chain
    source: str | None = None  # the drafter that drafted it, where a selector chose among several

    def __len__(self) -> int:
        return int(self.tokens.numel())

    @property
    def positions(self) -> int:
        """Positions drafted ahead: the length of a chain, the depth of a tree (what drafting cost scales with)."""
        if not self.parents:
            return len(self)
        return max(tree_depths(self.parents))

    def head(self, n: int) -> "Draft":
        """The first n drafts: a chain's prefix, or a tree's first n nodes (which hold their ancestors, parents[i] < i)."""
        if n >= len(self):
            return self
        return Draft(tokens=self.tokens[:n], probs=None if self.probs is None else self.probs[:n],
                     parents=None if self.parents is None else self.parents[:n], source=self.source)

    @staticmethod
    def empty() -> "Draft":
        return Draft(tokens=torch.empty(0, dtype=torch.long))


@dataclass
class DraftRequest:
    """What a drafter may know about the request it drafts for."""

    prompt_ids: list[int]
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    generator: torch.Generator | None = None  # the drafter's own random stream
    noise: Callable[[list[int]], torch.Tensor] | None = None  # coupled mode: (positions) -> (n, V) Gumbel noise
    costs: object = None  # the engine's CostModel (measured verify costs), for drafters that size trees
    allow_tree: bool = True  # False where the engine scores chains only (batched serving)
    adaptive: bool = True  # False: draft the most allowed every step (--no-adaptive), for drafters that decide it

    def draw(self, q: torch.Tensor, position: int) -> int:
        """A draft token from q (V,) for `position`: argmax(log q + that position's noise) in coupled mode,
        else a sample from the drafter's own stream."""
        if self.noise is not None:
            return int((q.log() + self.noise([position])[0].to(q.device)).argmax())
        return int(sample(q.cpu(), self.generator))


class Drafter(ABC):
    """Proposes draft tokens for one request at a time."""

    name: str = ""
    #: True for drafters that read the target's final hidden states (observe() receives them)
    needs_features: bool = False

    def begin(self, request: DraftRequest) -> None:
        """Starts a new request."""
        self.request = request

    @abstractmethod
    def propose(self, context: list[int], k: int) -> Draft:
        """Up to k tokens to follow `context` (prompt + generated so far)."""

    def observe(self, features: torch.Tensor) -> None:
        """The target's hidden states (m, H) of the positions it just processed and kept, in order."""

    def learn(self, output: list[int]) -> None:
        """The tokens the target generated for a request that ended, for drafters that learn from past outputs."""

    def end(self) -> None:
        """Ends the request and frees per-request state."""

    def fork(self) -> "Drafter":
        """A fresh drafter for another concurrent request, sharing weights and other heavy state."""
        raise NotImplementedError(f"drafter {self.name!r} cannot serve concurrent requests")
