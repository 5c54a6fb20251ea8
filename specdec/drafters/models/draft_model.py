"""A smaller causal LM with the target's tokenizer drafts k tokens autoregressively (cross_tokenizer.py: with
another tokenizer).

Confidence stop (llama.cpp's --draft-p-min, transformers' assistant_confidence_threshold): with p_min > 0, drafting
ends after the first token whose draft probability is below p_min (that token is kept). The probability is the
draft's softmax of that token under greedy decoding, else q(token), the distribution it was drawn from. Stopping only
shortens the draft: each position's q and token are the ones drafting used, so verification stays lossless.

In a batch, greedy requests without penalties draft together (propose_together) where the draft backend runs
several sequences in one pass (CausalLM.batched): one pass a drafted token for all of them instead of one each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

import torch

from ...costs import SharedPasses, time_by_size
from ...models.backend import CausalLM, SequenceCache
from ...penalties import TokenHistory, penalize
from ...sampling import probs_from_logits
from ...tokens import common_prefix
from ...verify import greedy_choices
from ..base import Budget, Draft, Drafter, DraftJob, DraftRequest
from ..options import check_p_min


@dataclass
class _Chain:
    """One request drafting in the shared passes of propose_together."""

    index: int  # its place among the jobs
    drafter: "DraftModelDrafter"
    k: int  # the most tokens it drafts
    pending: list[int]  # the tokens the next pass feeds it
    tokens: list[int] = field(default_factory=list)  # drafted so far


class DraftModelDrafter(Drafter):
    """Runs a draft backend up to k times per step, keeping its KV cache in sync with the context; with p_min > 0
    it stops after a token the draft gives less than p_min."""

    name = "draft-model"

    def __init__(
        self,
        draft: CausalLM,
        target_vocab_size: int,
        name: str = "draft-model",
        p_min: float = 0.0,
        shared: list[SharedPasses] | None = None,
    ):
        """shared: the draft's pass costs by rows, shared by every fork (measured when a batch first drafts)."""
        self.name = name
        self.draft = draft
        self.device = draft.info.device  # where its logits are
        self.vocab = target_vocab_size
        self.p_min = check_p_min(p_min)
        self.cache: SequenceCache | None = None  # the draft's own KV cache, from the first request on
        self.cached: list[int] = []  # tokens whose keys and values the draft cache holds
        self.shared = shared if shared is not None else []

    def fork(self) -> "DraftModelDrafter":
        return DraftModelDrafter(self.draft, self.vocab, self.name, self.p_min, self.shared)

    def pass_sharing(self) -> SharedPasses | None:
        """The draft's pass costs where this request drafts in passes shared with others (a greedy request without
        penalties, on a backend that runs several sequences in one pass: propose_together), else None."""
        sampling = self.current.sampling if self.request is not None else None
        if not self.draft.batched or sampling is None or not sampling.greedy or sampling.penalized:
            return None
        if not self.shared:
            measured = self._time_passes_in(self._cache())
            if measured is None:
                return None  # no room past this request's cache: another request measures
            self.shared.append(SharedPasses(measured))
        return self.shared[0]

    @torch.inference_mode()
    def propose_together(self, jobs: list[DraftJob]) -> list[Draft]:
        """Chains for requests whose drafters share this draft model (pass_sharing), all in one pass a drafted token:
        each request's drafts are those propose would make for it (the pass is batch-invariant on specdec's
        kernels; elsewhere, it decides only which drafts are proposed)."""
        drafts: dict[int, Draft] = {}
        live = []
        for i, (job_drafter, context, k) in enumerate(jobs):
            drafter = cast(DraftModelDrafter, job_drafter)  # pass_sharing groups this drafter's jobs only
            if k <= 0:
                drafts[i] = Draft.empty()
            else:
                live.append(_Chain(i, drafter, k, drafter._sync(context)))
        active = live
        while active:
            start = time.perf_counter()
            outputs = self.draft.forward_batch(
                [c.drafter._cache() for c in active], [torch.tensor(c.pending) for c in active], last_only=True
            )
            self.shared[0].observe(sum(len(c.pending) for c in active), time.perf_counter() - start)
            going = []
            for chain, out in zip(active, outputs):
                logits = _fit_vocab(out.logits[-1].float(), self.vocab)
                token = int(greedy_choices(logits))
                chain.tokens.append(token)
                # as propose: the last token is not fed, so the cache holds the context and the drafts before it
                if len(chain.tokens) < chain.k and not chain.drafter._unsure(logits, None, token):
                    chain.pending = [token]
                    chain.drafter.cached.append(token)
                    going.append(chain)
            active = going
        for chain in live:
            drafts[chain.index] = Draft(tokens=torch.tensor(chain.tokens, dtype=torch.long))
        return [drafts[i] for i in range(len(jobs))]

    @torch.inference_mode()
    def _time_passes_in(
        self, cache: SequenceCache, sizes=(1, 2, 4, 8, 16), repeats: int = 3
    ) -> dict[int, float] | None:
        """{rows: seconds} of the draft's pass over that many rows of one sequence (time_by_size): what a pass over
        that many sequences' one token each costs, but for their attention. Timed in `cache` past its length, each
        pass truncated away, so that no slot is taken (the draft's pool is sized for the batch); None where the
        cache has no room for the largest."""
        length = cache.length
        if length + max(sizes) > self.draft.info.max_context:
            return None
        feeds = {rows: torch.randint(0, self.draft.info.vocab_size, (rows,)) for rows in sizes}
        return time_by_size(
            lambda rows: self.draft.forward(cache, feeds[rows], last_only=True),
            lambda _rows: self.draft.truncate(cache, length),
            sizes,
            repeats,
        )

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self.cache = self.cache or self.draft.new_cache()
        self.draft.truncate(self.cache, 0)
        self.cached = []

    def end(self) -> None:
        if self.cache is not None:
            self.draft.release(self.cache)
            self.cache = None

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        k = budget.k
        if k <= 0:
            return Draft.empty()
        pending = self._sync(context)
        sampling = self.current.sampling
        history = None
        if sampling.penalized:  # the request's penalties, as the target applies them: fewer rejected drafts
            history = TokenHistory.of(self.current.prompt_ids, context, self.vocab, self.device)
        tokens, rows = [], []
        for i in range(k):
            logits = _fit_vocab(self._next_logits(pending).float(), self.vocab)
            if history is not None:
                logits = penalize(logits[None], history.counts[None], history.seen[None], sampling)[0]
            position = len(context) + i
            q = None
            if sampling.greedy:
                token = int(greedy_choices(logits))
            else:
                q = probs_from_logits(logits, sampling)
                token = self.current.draw(q, position)
                rows.append(q)
            tokens.append(token)
            if i == k - 1 or self._unsure(logits, q, token):
                break  # the last token is not fed: the cache holds the context and the drafts before it
            if history is not None:
                history.extend([token])
            pending = [token]
            self.cached.append(token)
        probs = torch.stack(rows) if rows else None
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), probs=probs)

    def _sync(self, context: list[int]) -> list[int]:
        """Rolls the draft cache back to what it shares with `context` (never all of it) and returns the tokens to
        feed next."""
        keep = common_prefix(self.cached, context)
        keep = min(keep, len(context) - 1)  # always re-feed at least the last token
        self.draft.truncate(self._cache(), keep)
        self.cached = list(context)
        return context[keep:]

    def _next_logits(self, pending: list[int]) -> torch.Tensor:
        """Feeds `pending` to the draft and returns its logits (V_draft,) for the next token."""
        ids = torch.tensor(pending, dtype=torch.long)
        return self.draft.forward(self._cache(), ids, last_only=True).logits[-1]

    def _cache(self) -> SequenceCache:
        """The draft's KV cache, which begin() made."""
        if self.cache is None:
            raise RuntimeError("the draft model drafts for no request: begin() was not called")
        return self.cache

    def _unsure(self, logits: torch.Tensor, q: torch.Tensor | None, token: int) -> bool:
        """Whether the draft's probability of `token` is below p_min: softmax(logits (V,)) under greedy decoding,
        else q (V,)."""
        if self.p_min == 0.0:
            return False
        probs = logits.softmax(-1) if q is None else q
        return float(probs[token]) < self.p_min


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Pads with -inf or cuts the draft's logits (V_draft,) to the target's vocabulary size."""
    if logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    pad = torch.full((vocab - logits.shape[-1],), float("-inf"), device=logits.device)
    return torch.cat([logits, pad])
