"""A draft model with a tokenizer of its own (universal assisted decoding): drafts pass through text.

Each step the target's context is decoded to text and encoded with the draft's tokenizer; the draft model
continues it greedily (its KV cache kept for the common prefix, as DraftModelDrafter keeps it); the text it adds
is encoded with the target's tokenizer behind a look-behind of the context's last target tokens, and proposed
when that encoding starts with exactly those tokens (else the step drafts nothing). The drafts are a
deterministic function of the context (q one-hot), so greedy and sampled verification stay lossless without the
draft's probabilities, which live over another vocabulary.
"""

from __future__ import annotations

import torch

from ...models.backend import CausalLM
from ..base import Budget, Draft, Drafter, DraftRequest
from .draft_model import DraftModelDrafter

LOOK_BEHIND = 8  # target tokens re-encoded with the draft's new text, so that a word cut at the boundary aligns


def same_vocabulary(target_tokenizer, draft_tokenizer) -> bool:
    return target_tokenizer.get_vocab() == draft_tokenizer.get_vocab()


class CrossTokenizerDrafter(Drafter):
    """Drafts with `draft` (a backend over the draft tokenizer's vocabulary) for a target with another tokenizer."""

    name = "draft-model"

    def __init__(self, draft: CausalLM, draft_tokenizer, target_tokenizer, p_min: float = 0.0):
        self.inner = DraftModelDrafter(draft, draft.info.vocab_size, p_min=p_min)  # p_min: its confidence stop
        self.draft_tokenizer, self.target_tokenizer = draft_tokenizer, target_tokenizer

    def fork(self) -> "CrossTokenizerDrafter":
        return CrossTokenizerDrafter(self.inner.draft, self.draft_tokenizer, self.target_tokenizer, self.inner.p_min)

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self.inner.begin(DraftRequest(prompt_ids=[]))  # greedy, without the request's penalties (another vocabulary)

    def end(self) -> None:
        self.inner.end()

    def propose(self, context: list[int], budget: Budget) -> Draft:
        k = budget.k
        if k <= 0:
            return Draft.empty()
        ids = self._encode_draft(self._decode_target(context))
        if not ids or len(ids) + k >= self.inner.draft.info.max_context:
            return Draft.empty()
        new = self.inner.propose(ids, Budget(k)).tokens.tolist()
        before = self.draft_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        after = self.draft_tokenizer.decode(ids + new, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not after.startswith(before) or len(after) == len(before):
            return Draft.empty()
        tail = context[-LOOK_BEHIND:]
        encoded = self.target_tokenizer(self._decode_target(tail) + after[len(before) :], add_special_tokens=False)[
            "input_ids"
        ]
        if encoded[: len(tail)] != tail:
            return Draft.empty()
        return Draft(tokens=torch.tensor(encoded[len(tail) : len(tail) + k], dtype=torch.long))

    def _decode_target(self, ids: list[int]) -> str:
        return self.target_tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _encode_draft(self, text: str) -> list[int]:
        return self.draft_tokenizer(text)["input_ids"]  # with the draft's own BOS, where it takes one
