"""Quantized self-speculation: a 4-bit copy of the target drafts, on the target's own KV cache.

The copy (kernels/quantized.h: weights in groups of 32 as d * u + m with u in 0..15, activations rounded to int8) is
the whole target at a quarter of bfloat16's bytes per weight, so it guesses every kind of prompt about as the target
would, with no training. It needs no KV cache of its own and no prefill: the target's cache already holds every
accepted token's keys and values, exactly. Drafting writes the copy's approximate keys and values for the positions
it drafts, past the cache's length, where the verify pass that follows writes the target's own before anything reads
them; the cache's length is never moved. So the output stays the target's: only which drafts are proposed depends on
the copy.

How close the copy is depends on the model: for a model whose weights came from a Q4_1 GGUF (the built-in
smollm2-135m) the groups hold exactly the target's weights and only the int8 activations differ; a model trained in
bfloat16 loses more to the rounding (docs/drafters.md).
"""
from __future__ import annotations

import torch

from .base import Budget, Draft, DraftRequest
from .draft_model import DraftModelDrafter


class QuantizedCopyDrafter(DraftModelDrafter):
    """Drafts k tokens one pass at a time with the target's 4-bit copy, on the request's target cache
    (DraftRequest.target_cache); p_min: stop after a draft the copy gives less than p_min (DraftModelDrafter)."""

    def __init__(self, target, copy, p_min: float = 0.0):
        """target: the KernelLlama whose caches the request uses; copy: its four_bit_copy()."""
        super().__init__(target, target.info.vocab_size, name="quantized", p_min=p_min)
        self.copy = copy
        self.position = 0  # the position the next fed token takes
        self._fixed = {"offsets": torch.tensor([0, 1]), "rows": torch.tensor([0]),
                       "masks": torch.empty(0, dtype=torch.uint8), "aux": torch.empty(0, dtype=torch.long)}

    def fork(self) -> "QuantizedCopyDrafter":
        return QuantizedCopyDrafter(self.draft, self.copy, self.p_min)

    def begin(self, request: DraftRequest) -> None:
        self.request = request
        self.cache = request.target_cache

    def end(self) -> None:
        self.cache = None  # the target's: the scheduler frees it

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        # the target caches everything but the last token, which the verify pass feeds with the drafts
        if self.cache is None or self.cache.length != len(context) - 1:
            return Draft.empty()
        room = self.draft.max_context - len(context)  # the verify pass writes len(context) - 1 + k + 1 positions
        return super().propose(context, Budget(min(budget.k, room), budget.tree))

    def _sync(self, context: list[int]) -> list[int]:
        self.position = len(context) - 1
        return context[-1:]

    def _next_logits(self, pending: list[int]) -> torch.Tensor:
        """One pass of the copy over the single token `pending` at self.position, writing its keys and values into
        the target's cache there (past its length): logits (V,)."""
        (token,) = pending
        at = torch.tensor([self.position])
        f = self._fixed
        logits, _, _ = self.copy.forward(torch.tensor([token]), f["offsets"], torch.tensor([self.cache.slot]), at, at,
                                         f["masks"], self.draft.pool.keys, self.draft.pool.values, f["rows"], 0, False,
                                         f["aux"])
        self.position += 1
        return logits[0]
