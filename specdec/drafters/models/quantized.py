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
from typing import cast
from dataclasses import dataclass, field

import numpy as np
import torch

from ...costs import SharedPasses, time_by_size
from ..base import Budget, Draft, DraftJob, DraftRequest
from .draft_model import DraftModelDrafter
from ..options import check_p_min
from ...verify import greedy_choices
from ..lookup.ngram import ngram_lookup

LOOKUP_MIN_N, LOOKUP_MAX_N = 2, 4  # prompt lookup's n-gram sizes for the guess the copy checks (greedy requests)


@dataclass
class _Job:
    """One greedy request drafting in the shared passes of propose_together."""

    index: int  # its place among the jobs
    drafter: "QuantizedCopyDrafter"
    context: list[int]
    k: int  # the most tokens it drafts
    position: int  # the position the next token fed for it takes
    tokens: list[int] = field(default_factory=list)  # drafted so far
    logits: torch.Tensor | None = None  # (V,) the copy's logits that chose its latest draft

    def unsure(self) -> bool:
        """Whether the copy gave its latest draft less than p_min (DraftModelDrafter._unsure)."""
        return self.logits is not None and self.drafter._unsure(self.logits, None, self.tokens[-1])


class QuantizedCopyDrafter(DraftModelDrafter):
    """Drafts k tokens with the target's 4-bit copy, one pass a token, on the request's target cache
    (DraftRequest.target_cache); for greedy requests prompt lookup's guess rides along in every pass, and the
    part of it the copy agrees with costs nothing more. Greedy requests drafted together (propose_together) share
    each pass. p_min: stop after a draft the copy gives less than p_min (DraftModelDrafter)."""

    def __init__(self, target, copy, p_min: float = 0.0, passes: SharedPasses | None = None):
        """target: the KernelLlama whose caches the request uses; copy: its four_bit_copy(). passes: the copy's
        pass time by rows, shared by every fork (None: measured now)."""
        self.name, self.vocab, self.p_min = "quantized", target.info.vocab_size, check_p_min(p_min)
        self.device = target.info.device
        self.target = target  # the copy drafts on its caches: it has none of its own
        self.copy = copy
        self.cache = None  # the request's target cache, from begin() to end()
        self.cached: list[int] = []  # DraftModelDrafter.propose's record of fed tokens: the copy feeds from position
        self.position = 0  # the position the next token fed alone (a sampling request's draft) takes
        self.passes = passes or SharedPasses(self._measure_passes())

    def fork(self) -> "QuantizedCopyDrafter":
        return QuantizedCopyDrafter(self.target, self.copy, self.p_min, self.passes)

    def pass_sharing(self) -> SharedPasses | None:
        """The copy's pass costs where this request drafts in passes shared with others (greedy, no penalties:
        propose_together), else None."""
        sampling = self.current.sampling if self.request is not None else None
        return self.passes if sampling is not None and sampling.greedy and not sampling.penalized else None

    def begin(self, request: DraftRequest) -> None:
        self.request = request
        self.cache = request.target_cache

    def end(self) -> None:
        self.cache = None  # the target's: the scheduler frees it

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        return self.propose_together([DraftJob(self, context, budget.k)])[0]

    @torch.inference_mode()
    def propose_together(self, jobs: list[DraftJob]) -> list[Draft]:
        """Drafts for requests whose drafters share this copy. Greedy ones draft in shared passes, each feeding
        every request's latest token (its last context token, then its latest draft) and prompt lookup's guess of
        what follows, until each has k drafts or the copy is unsure (p_min): the part of a guess the copy agrees
        with is drafted by the same pass. Others draft alone. Each job's drafter keeps its own state: the shared
        passes' positions are this call's."""
        drafts: dict[int, Draft] = {}
        live: list[_Job] = []
        for i, (job_drafter, context, k) in enumerate(jobs):
            drafter = cast(QuantizedCopyDrafter, job_drafter)  # pass_sharing groups this drafter's jobs only
            k = drafter._room(context, k)
            sampling = drafter.current.sampling if k > 0 else None
            if sampling is None or not sampling.greedy or sampling.penalized:
                drafts[i] = DraftModelDrafter.propose(drafter, context, Budget(k))  # empty where k <= 0
                continue
            live.append(_Job(i, drafter, context, k, position=len(context) - 1))
        active = live
        while active:
            guesses = [_lookup(job.context + job.tokens, job.k - len(job.tokens) - 1) for job in active]
            feeds = [(job.tokens[-1:] or job.context[-1:]) + guess for job, guess in zip(active, guesses)]
            passes = self._timed_passes([j.drafter.cache for j in active], [j.position for j in active], feeds)
            for job, guess, logits in zip(active, guesses, passes):
                choices = greedy_choices(logits).tolist()
                agreed = 0
                while agreed < len(guess) and choices[agreed] == guess[agreed]:
                    agreed += 1
                job.tokens += guess[:agreed] + [choices[agreed]]
                job.logits = logits[agreed]
                job.position += 1 + agreed  # the copy's own token is fed next, after the agreed guesses
            active = [j for j in active if len(j.tokens) < j.k and not j.unsure()]
        for job in live:
            drafts[job.index] = Draft(tokens=torch.tensor(job.tokens[: job.k], dtype=torch.long))
        return [drafts[i] for i in range(len(jobs))]

    def _room(self, context: list[int], k: int) -> int:
        """k, cut so that the verify pass (k + 1 positions from len(context) - 1) stays in the cache; 0 unless the
        target caches everything but the context's last token (which the verify pass feeds with the drafts)."""
        if self.cache is None or self.cache.length != len(context) - 1:
            return 0
        return min(k, self.target.max_context - len(context))

    def _sync(self, context: list[int]) -> list[int]:
        self.position = len(context) - 1
        return context[-1:]

    def _next_logits(self, pending: list[int]) -> torch.Tensor:
        logits = self._timed_passes([self.cache], [self.position], [pending])[0][-1]
        self.position += len(pending)
        return logits

    def _timed_passes(self, caches, starts: list[int], feeds: list[list[int]]) -> list[torch.Tensor]:
        """_passes, its time observed in the copy's pass costs (shared by every fork)."""
        start = time.perf_counter()
        logits = self._passes(caches, starts, feeds)
        if feeds:
            self.passes.observe(sum(len(f) for f in feeds), time.perf_counter() - start)
        return logits

    def _passes(self, caches, starts: list[int], feeds: list[list[int]]) -> list[torch.Tensor]:
        """One pass of the copy over each feed's tokens from its start position on, in its target cache (past its
        length, where it writes the copy's keys and values), all in one call: logits (len(feed), V) of each."""
        if not feeds:
            return []
        lengths = [len(f) for f in feeds]
        positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lengths)])
        slots = torch.tensor([c.slot for c in caches])
        logits, _, _ = self.copy.forward(
            torch.tensor([t for f in feeds for t in f]),
            torch.tensor([0] + lengths).cumsum(0),
            slots,
            torch.tensor(starts),
            positions,
            _NO_MASK,
            self.target.pool.keys,
            self.target.pool.values,
            torch.arange(sum(lengths)),
            0,
            False,
            _NO_LAYERS,
            False,
        )
        return list(logits.split(lengths))

    @torch.inference_mode()
    def _measure_passes(self, sizes=(1, 2, 4, 8, 16), context: int = 128, repeats: int = 3) -> dict[int, float]:
        """{rows: seconds} of the copy's pass over that many rows after `context` cached tokens (time_by_size)."""
        context = max(1, min(context, self.target.max_context - max(sizes)))
        cache = self.target.new_cache()
        try:
            self.target.forward(cache, torch.randint(0, self.target.info.vocab_size, (context,)), last_only=True)
            feeds = {rows: torch.randint(0, self.target.info.vocab_size, (rows,)).tolist() for rows in sizes}
            return time_by_size(
                lambda rows: self._passes([cache], [context], [feeds[rows]]), lambda _rows: None, sizes, repeats
            )
        finally:
            self.target.release(cache)


def _lookup(tokens: list[int], k: int) -> list[int]:
    """Prompt lookup's guess of up to k tokens after `tokens` (none where k <= 0)."""
    if k <= 0:
        return []
    return ngram_lookup(np.asarray(tokens, dtype=np.int64), k, LOOKUP_MIN_N, LOOKUP_MAX_N).tolist()


_NO_MASK, _NO_LAYERS = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.long)
