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

import numpy as np
import torch

from .base import Budget, Draft, DraftRequest
from .draft_model import DraftModelDrafter
from .ngram import ngram_lookup

LOOKUP_MIN_N, LOOKUP_MAX_N = 2, 4  # prompt lookup's n-gram sizes for the guess the copy checks (greedy requests)


class QuantizedCopyDrafter(DraftModelDrafter):
    """Drafts k tokens with the target's 4-bit copy, one pass a token, on the request's target cache
    (DraftRequest.target_cache); for greedy requests prompt lookup's guess rides along in the first pass, and the
    part of it the copy agrees with costs nothing more. p_min: stop after a draft the copy gives less than p_min
    (DraftModelDrafter)."""

    def __init__(self, target, copy, p_min: float = 0.0):
        """target: the KernelLlama whose caches the request uses; copy: its four_bit_copy()."""
        super().__init__(target, target.info.vocab_size, name="quantized", p_min=p_min)
        self.copy = copy
        self.position = 0  # the position the next fed token takes
        self._fixed = {"masks": torch.empty(0, dtype=torch.uint8), "aux": torch.empty(0, dtype=torch.long)}

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
        k = min(budget.k, self.draft.max_context - len(context))  # the verify pass writes k + 1 positions
        sampling = self.request.sampling
        if k <= 0 or not sampling.greedy or sampling.penalized:
            return super().propose(context, Budget(k, budget.tree))
        # Greedy: prompt lookup's guess is checked by the copy in the pass that drafts the first token; the part
        # it agrees with is drafted at no further cost (what the output copies from the context: names, code,
        # a document's sentences), then the copy drafts on one token at a time.
        guess = ngram_lookup(np.asarray(context, dtype=np.int64), k, LOOKUP_MIN_N, LOOKUP_MAX_N).tolist()
        self.position = len(context) - 1
        logits = self._pass([context[-1]] + guess)  # (1 + len(guess), V)
        choices = logits.argmax(-1).tolist()
        agreed = 0
        while agreed < len(guess) and choices[agreed] == guess[agreed]:
            agreed += 1
        tokens, last = guess[:agreed] + [choices[agreed]], logits[agreed]
        self.position = len(context) + agreed  # where the copy's own token is fed next
        while len(tokens) < k and not self._unsure(last, None, tokens[-1]):
            last = self._pass(tokens[-1:])[0]
            tokens.append(int(last.argmax()))
        return Draft(tokens=torch.tensor(tokens[:k], dtype=torch.long))

    def _sync(self, context: list[int]) -> list[int]:
        self.position = len(context) - 1
        return context[-1:]

    def _next_logits(self, pending: list[int]) -> torch.Tensor:
        return self._pass(pending)[-1]

    def _pass(self, tokens: list[int]) -> torch.Tensor:
        """One pass of the copy over `tokens` (T,) from self.position on, writing their keys and values into the
        target's cache there (past its length): logits (T, V)."""
        T = len(tokens)
        f = self._fixed
        logits, _, _ = self.copy.forward(torch.tensor(tokens), torch.tensor([0, T]), torch.tensor([self.cache.slot]),
                                         torch.tensor([self.position]), torch.arange(self.position, self.position + T),
                                         f["masks"], self.draft.pool.keys, self.draft.pool.values, torch.arange(T), 0,
                                         False, f["aux"])
        self.position += T
        return logits
