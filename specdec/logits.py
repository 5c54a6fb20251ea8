"""A request's logit adjustments that depend on its text: penalties and a structured-output constraint, per scored row.

A verify pass scores the row after the emitted text and one row per draft. Row r continues the text by the drafts
on its path (a chain's row i: drafts 0..i-1; a tree's row: its node and the node's ancestors), so each row gets the
penalties of that text (penalties.py) and the constraint's mask after it (structured.py): the target's greedy
choice and distribution at every position are those plain decoding would see there. Requests that ask for neither
never reach this module (Request.logits_processor is None).
"""

from __future__ import annotations

import torch

from .config import GenerationConfig
from .penalties import TokenHistory, chain_ancestors, penalize, tree_ancestors
from .structured import ConstraintState, apply_masks
from .verify import Draft


class LogitsProcessor:
    """One request's penalties (counts of its output, the tokens it has seen) and constraint (a matcher)."""

    def __init__(self, prompt_ids: list[int], config: GenerationConfig, info, tokenizer=None):
        """info: the target's ModelInfo (vocabulary, device, EOS ids); tokenizer: the target's, for a constraint."""
        self.sampling = config.sampling
        self.history = TokenHistory(prompt_ids, info.vocab_size, info.device) if self.sampling.penalized else None
        self.constraint = (
            None
            if config.constraint is None
            else ConstraintState(config.constraint, tokenizer, info.vocab_size, info.eos_token_ids)
        )

    @staticmethod
    def wanted(config: GenerationConfig) -> bool:
        """Whether a request's logits need adjusting at all (penalties, logit bias or a constraint)."""
        return config.sampling.penalized or config.constraint is not None

    def rows(self, logits: torch.Tensor, draft: Draft) -> torch.Tensor:
        """logits (1 + k, V) of the rows a pass scored for a draft of k tokens -> (1 + k, V): penalized, each row
        counting the drafts on its path, then masked to what the constraint lets follow that path."""
        if self.history is not None:
            ancestors = tree_ancestors(draft.parents) if draft.parents is not None else chain_ancestors(len(draft))
            counts, seen = self.history.rows(draft.tokens, ancestors)
            logits = penalize(logits, counts, seen, self.sampling)
        if self.constraint is not None:
            logits = apply_masks(logits, self.constraint.row_masks(draft.tokens.tolist(), draft.parents))
        return logits

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces next (drafted for free); none without a constraint."""
        return self.constraint.forced(limit) if self.constraint is not None else []

    def ends_text(self, token: int) -> bool:
        """Takes one emitted token; True where it completes the constrained text (only EOS may follow)."""
        return self.constraint is not None and self.constraint.advance(token)

    def extend(self, tokens: list[int]) -> None:
        """Counts the emitted tokens for the penalties."""
        if self.history is not None:
            self.history.extend(tokens)
