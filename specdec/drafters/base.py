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
from ..verify import Draft  # what propose returns: defined with the rules that verify it


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
