"""Structured output: a JSON schema, a regular expression or a Lark grammar constrains what the target may emit.

llguidance (the engine vLLM's "guidance" backend and llama.cpp use) turns the constraint into a matcher that
gives, at each position, the set of tokens that keep the text valid. The verify pass masks every scored row
with the set that holds after the drafts on its path (chain or tree; the matcher consumes the path, then rolls
back), so drafts that break the constraint are rejected like any other wrong guess and the output is exactly
what constrained plain decoding gives: greedy token for token, sampling in distribution. When the text is
complete only the end-of-sequence token is allowed, and the request ends there.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import torch

from .config import Constraint
from .errors import ConfigError, ConstraintError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions

# JSON as json.dumps writes it ({"a": 1, "b": [2, 3]}), unless the schema's "x-guidance" says otherwise: with any
# whitespace allowed, small models tend to fill objects with runs of spaces and newlines.
JSON_LAYOUT: JsonCompileOptions = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@lru_cache(maxsize=64)
def grammar_text(constraint: Constraint) -> str:
    """llguidance's grammar text for a constraint (cached: a server checks a request's constraint on arrival,
    then builds its matcher)."""
    from llguidance import LLMatcher

    if constraint.kind == "json_schema":
        try:
            return LLMatcher.grammar_from_json_schema(constraint.text, defaults=JSON_LAYOUT)
        except ValueError as exc:
            raise ConfigError(f"the JSON schema is not valid: {exc}") from None
    if constraint.kind == "regex":
        return LLMatcher.grammar_from_regex(constraint.text)
    return LLMatcher.grammar_from_lark(constraint.text)


def check(constraint: Constraint) -> None:
    """Raises ConfigError (one line) where the schema, regex or grammar cannot be compiled."""
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar_text(constraint))
    if error:
        raise _invalid(constraint, error)


def _invalid(constraint: Constraint, error: str) -> ConfigError:
    """llguidance's error, its first line, as a one-line ConfigError."""
    first = next((line.strip() for line in error.splitlines() if line.strip()), error)
    return ConfigError(f"invalid {constraint.kind.replace('_', ' ')}: {first}")


@lru_cache(maxsize=4)
def _ll_tokenizer(tokenizer, vocab_size: int, eos: tuple[int, ...]):
    """llguidance's view of a Hugging Face fast tokenizer (about half a second to build; cached)."""
    import llguidance.hf

    if tokenizer is None:
        raise ConfigError("structured output needs the model's tokenizer")
    try:
        return llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos) or None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"structured output needs a fast Hugging Face tokenizer: {exc}") from None


def unsupported_reason(tokenizer, vocab_size: int, eos: tuple[int, ...]) -> str | None:
    """Why structured output cannot run with this tokenizer, or None (builds and caches llguidance's view)."""
    try:
        _ll_tokenizer(tokenizer, vocab_size, tuple(eos))
    except ConfigError as exc:
        return str(exc)
    return None


class ConstraintState:
    """One request's matcher; its state follows the tokens the request has emitted."""

    def __init__(self, constraint: Constraint, tokenizer, vocab_size: int, eos: tuple[int, ...]):
        from llguidance import LLMatcher

        self.vocab_size = vocab_size
        self.matcher = LLMatcher(
            _ll_tokenizer(tokenizer, vocab_size, tuple(eos)), grammar_text(constraint), log_level=0
        )
        if self.matcher.is_error():
            raise _invalid(constraint, self.matcher.get_error())
        self._words = torch.empty((vocab_size + 31) // 32, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32)

    def _mask(self) -> torch.Tensor:
        """(V,) bool: the tokens allowed next."""
        self.matcher.unsafe_compute_mask_ptr(self._words.data_ptr(), self._words.numel() * 4)
        return ((self._words.unsqueeze(-1) >> self._bits) & 1).reshape(-1)[: self.vocab_size].bool()

    def row_masks(self, drafts: list[int], parents: list[int] | None = None) -> torch.Tensor:
        """(1 + k, V) bool for the rows a verify pass scores: row 0 allows what may follow the emitted text, row
        i + 1 what may follow draft i's path (a chain, or a tree by its parents). The matcher consumes each path and
        rolls it back. A row behind a draft the constraint refuses copies its parent's row: that draft is
        rejected, so the row is never used."""
        rows = [self._mask()]
        paths: list[list[int]] = []
        for i, token in enumerate(drafts):
            parent = i - 1 if parents is None else parents[i]
            paths.append((paths[parent] if parent >= 0 else []) + [token])
            consumed = self.matcher.try_consume_tokens(paths[i])
            rows.append(self._mask() if consumed == len(paths[i]) else rows[parent + 1])
            if consumed:
                self.matcher.rollback(consumed)
        return torch.stack(rows)

    def forced(self, limit: int) -> list[int]:
        """Up to `limit` tokens the constraint forces next (a JSON key, its quotes and colon): drafts the target
        accepts unless it spells the same text with other tokens (jump-forward decoding, verified like any draft)."""
        return self.matcher.compute_ff_tokens()[:limit]

    def advance(self, token: int) -> bool:
        """Consumes an emitted token (one its row's mask allowed); True once the text is complete (nothing but the
        end of the sequence may follow)."""
        if not self.matcher.consume_token(token):
            error = next((line for line in self.matcher.get_error().splitlines() if line.strip()), "")
            raise ConstraintError(f"the output constraint cannot be followed with this model's tokenizer: {error}")
        return self.matcher.is_stopped()


def apply_masks(logits: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """logits (R, V) with the tokens each row's mask (R, V) refuses set to -inf."""
    return logits.masked_fill(~masks.to(logits.device), float("-inf"))
