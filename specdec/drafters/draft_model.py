"""A smaller causal LM with the target's tokenizer drafts k tokens autoregressively (cross_tokenizer.py: with
another tokenizer)."""
from __future__ import annotations

import torch

from ..models.backend import CausalLM
from ..penalties import TokenHistory, penalize
from ..sampling import probs_from_logits
from .base import Draft, Drafter, DraftRequest, common_prefix


class DraftModelDrafter(Drafter):
    """Runs a draft backend k times per step, keeping its KV cache in sync with the context."""

    name = "draft-model"

    def __init__(self, draft: CausalLM, target_vocab_size: int, name: str = "draft-model"):
        self.name = name
        self.draft = draft
        self.vocab = target_vocab_size
        self.cache = None
        self.cached: list[int] = []  # tokens whose keys and values the draft cache holds

    def fork(self) -> "DraftModelDrafter":
        return DraftModelDrafter(self.draft, self.vocab, self.name)

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        if self.cache is None:
            self.cache = self.draft.new_cache()
        self.draft.truncate(self.cache, 0)
        self.cached = []

    def end(self) -> None:
        if self.cache is not None:
            self.draft.release(self.cache)
            self.cache = None

    @torch.inference_mode()
    def propose(self, context: list[int], k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        keep = common_prefix(self.cached, context)
        keep = min(keep, len(context) - 1)  # always re-feed at least the last token
        self.draft.truncate(self.cache, keep)
        pending = context[keep:]
        self.cached = list(context)
        sampling = self.request.sampling
        history = None
        if sampling.penalized:  # the request's penalties, as the target applies them: fewer rejected drafts
            history = TokenHistory.of(self.request.prompt_ids, context, self.vocab, self.draft.info.device)
        tokens, rows = [], []
        for i in range(k):
            ids = torch.tensor(pending, dtype=torch.long)
            logits = self.draft.forward(self.cache, ids, last_only=True).logits[-1]  # (V_draft,)
            logits = _fit_vocab(logits.float(), self.vocab)
            if history is not None:
                logits = penalize(logits[None], history.counts[None], history.seen[None], sampling)[0]
            position = len(context) + i
            if sampling.greedy:
                token = int(logits.argmax())
            else:
                q = probs_from_logits(logits, sampling)
                token = self.request.draw(q, position)
                rows.append(q)
            tokens.append(token)
            if history is not None:
                history.extend([token])
            pending = [token]
            if i < k - 1:
                self.cached.append(token)
        probs = torch.stack(rows) if rows else None
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long), probs=probs)


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Pads with -inf or cuts the draft's logits (V_draft,) to the target's vocabulary size."""
    if logits.shape[-1] == vocab:
        return logits
    if logits.shape[-1] > vocab:
        return logits[..., :vocab]
    pad = torch.full((vocab - logits.shape[-1],), float("-inf"), device=logits.device)
    return torch.cat([logits, pad])

