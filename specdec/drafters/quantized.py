"""Quantized self-speculation: a 4-bit copy of the target drafts, on the target's own KV cache.

The copy (kernels/quantized.h: the layers' weights in groups of 32 as d * u + m with u in 0..15, a 4-bit LM head
whose highest logits are rescored in 8 bits, activations rounded to int8) is the whole target at about a third of
bfloat16's bytes, so it guesses every kind of prompt about as the target would, with no training. It needs no KV
cache of its own and no prefill: the target's cache already holds every accepted token's keys and values, exactly.
Drafting writes the copy's approximate keys and values for the positions it drafts, past the cache's length, where
the verify pass that follows writes the target's own before anything reads them; the cache's length is never moved.
So the output stays the target's: only which drafts are proposed depends on the copy.

How close the copy is depends on the model: for a model whose weights came from a Q4_1 GGUF (the built-in
smollm2-135m) the groups hold exactly the target's weights and only the int8 activations differ; a model trained in
bfloat16 loses more to the rounding (docs/drafters.md).
"""
from __future__ import annotations

import time

import numpy as np
import torch

from ..costs import SharedPasses, time_by_size
from .base import Budget, Draft, DraftRequest
from .draft_model import DraftModelDrafter
from ..verify import greedy_choices
from .ngram import ngram_lookup

LOOKUP_MIN_N, LOOKUP_MAX_N = 2, 4  # prompt lookup's n-gram sizes for the guess the copy checks (greedy requests)


class QuantizedCopyDrafter(DraftModelDrafter):
    """Drafts k tokens with the target's 4-bit copy, one pass a token, on the request's target cache
    (DraftRequest.target_cache); for greedy requests prompt lookup's guess rides along in every pass, and the
    part of it the copy agrees with costs nothing more. Greedy requests drafted together (propose_together) share
    each pass. p_min: stop after a draft the copy gives less than p_min (DraftModelDrafter)."""

    def __init__(self, target, copy, p_min: float = 0.0, passes: SharedPasses | None = None):
        """target: the KernelLlama whose caches the request uses; copy: its four_bit_copy(). passes: the copy's
        pass time by rows, shared by every fork (None: measured now)."""
        super().__init__(target, target.info.vocab_size, name="quantized", p_min=p_min)
        self.copy = copy
        self.position = 0  # the position the next fed token takes
        self.passes = passes or SharedPasses(self._measure_passes())

    def fork(self) -> "QuantizedCopyDrafter":
        return QuantizedCopyDrafter(self.draft, self.copy, self.p_min, self.passes)

    def pass_sharing(self) -> SharedPasses | None:
        """The copy's pass costs where this request drafts in passes shared with others (greedy, no penalties:
        propose_together), else None."""
        sampling = self.request.sampling if self.request is not None else None
        return self.passes if sampling is not None and sampling.greedy and not sampling.penalized else None

    def begin(self, request: DraftRequest) -> None:
        self.request = request
        self.cache = request.target_cache

    def end(self) -> None:
        self.cache = None  # the target's: the scheduler frees it

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        return self.propose_together([(self, context, budget.k)])[0]

    @torch.inference_mode()
    def propose_together(self, jobs: list[tuple["QuantizedCopyDrafter", list[int], int]]) -> list[Draft]:
        """Drafts for requests (drafter, context, k) whose drafters share this copy. Greedy ones draft in shared
        passes, each feeding every request's latest token (its last context token, then its latest draft) and
        prompt lookup's guess of what follows, until each has k drafts or the copy is unsure (p_min): the part of a
        guess the copy agrees with is drafted by the same pass. Others draft alone."""
        drafts: dict[int, Draft] = {}
        live = []  # [index, drafter, context, drafts so far, k, last logits (V,)]
        for i, (drafter, context, k) in enumerate(jobs):
            k = drafter._room(context, k)
            sampling = drafter.request.sampling if k > 0 else None
            if sampling is None or not sampling.greedy or sampling.penalized:
                drafts[i] = DraftModelDrafter.propose(drafter, context, Budget(k))  # empty where k <= 0
                continue
            drafter.position = len(context) - 1
            live.append([i, drafter, context, [], k, None])
        active = live
        while active:
            guesses = [_lookup(job[2] + job[3], job[4] - len(job[3]) - 1) for job in active]
            feeds = [(job[3][-1:] or job[2][-1:]) + guess for job, guess in zip(active, guesses)]
            for job, guess, logits in zip(active, guesses, self._passes([j[1] for j in active], feeds)):
                choices = greedy_choices(logits).tolist()
                agreed = 0
                while agreed < len(guess) and choices[agreed] == guess[agreed]:
                    agreed += 1
                job[3] += guess[:agreed] + [choices[agreed]]
                job[5] = logits[agreed]
                job[1].position -= len(guess) - agreed  # the copy's own token is fed next, after the agreed guesses
            active = [j for j in active if len(j[3]) < j[4] and not j[1]._unsure(j[5], None, j[3][-1])]
        for i, _, _, tokens, k, _ in live:
            drafts[i] = Draft(tokens=torch.tensor(tokens[:k], dtype=torch.long))
        return [drafts[i] for i in range(len(jobs))]

    def _room(self, context: list[int], k: int) -> int:
        """k, cut so that the verify pass (k + 1 positions from len(context) - 1) stays in the cache; 0 unless the
        target caches everything but the context's last token (which the verify pass feeds with the drafts)."""
        if self.cache is None or self.cache.length != len(context) - 1:
            return 0
        return min(k, self.draft.max_context - len(context))

    def _sync(self, context: list[int]) -> list[int]:
        self.position = len(context) - 1
        return context[-1:]

    def _next_logits(self, pending: list[int]) -> torch.Tensor:
        return self._passes([self], [pending])[0][-1]

    def _passes(self, drafters: list["QuantizedCopyDrafter"], feeds: list[list[int]]) -> list[torch.Tensor]:
        """One pass of the copy over each drafter's `feed` tokens from its position on, in its request's target
        cache (past its length, where it writes the copy's keys and values), all in one call: logits (len(feed), V)
        of each; positions move past the feeds."""
        if not drafters:
            return []
        start = time.perf_counter()
        lengths = [len(f) for f in feeds]
        starts = [d.position for d in drafters]
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)])
        slots = torch.tensor([d.cache.slot for d in drafters])
        logits, _, _ = self.copy.forward(torch.tensor([t for f in feeds for t in f]),
                                         torch.tensor([0] + lengths).cumsum(0), slots, torch.tensor(starts), positions,
                                         _NO_MASK, self.draft.pool.keys, self.draft.pool.values,
                                         torch.arange(sum(lengths)), 0, False, _NO_LAYERS)
        self.passes.observe(sum(lengths), time.perf_counter() - start)
        for d, n in zip(drafters, lengths):
            d.position += n
        return list(logits.split(lengths))

    @torch.inference_mode()
    def _measure_passes(self, sizes=(1, 2, 4, 8, 16), context: int = 128, repeats: int = 3) -> dict[int, float]:
        """{rows: median seconds} of the copy's pass over that many rows after `context` cached tokens."""
        context = max(1, min(context, self.draft.max_context - max(sizes)))
        cache = self.draft.new_cache()
        try:
            self.draft.forward(cache, torch.randint(0, self.draft.info.vocab_size, (context,)), last_only=True)
            probe = QuantizedCopyDrafter(self.draft, self.copy, passes=SharedPasses({1: 1.0}))
            probe.cache, probe.position = cache, context
            feeds = {rows: torch.randint(0, self.draft.info.vocab_size, (rows,)).tolist() for rows in sizes}

            def reset(_rows: int) -> None:
                probe.position = context

            return time_by_size(lambda rows: probe._passes([probe], [feeds[rows]]), reset, sizes, repeats)
        finally:
            self.draft.release(cache)


def _lookup(tokens: list[int], k: int) -> list[int]:
    """Prompt lookup's guess of up to k tokens after `tokens` (none where k <= 0)."""
    if k <= 0:
        return []
    return ngram_lookup(np.asarray(tokens, dtype=np.int64), k, LOOKUP_MIN_N, LOOKUP_MAX_N).tolist()


_NO_MASK, _NO_LAYERS = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.long)
