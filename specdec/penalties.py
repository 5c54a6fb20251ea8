"""Logit adjustments that depend on the text so far, applied before the sampler chain (and before greedy's argmax).

In order: logit_bias (OpenAI: a fixed amount added to chosen tokens), the repetition penalty (transformers,
CTRL: a logit of a token already in the prompt or the output is divided by the penalty when positive,
multiplied by it when negative), then OpenAI's frequency and presence penalties (minus count * frequency
and minus presence for each token of the output so far; the prompt does not count, as in vLLM).

A verify pass scores several positions at once, and row r continues the text by the drafts on its path:
each row gets its own counts, those of the text so far plus those of the drafts before it. So the target's
distribution at every position is what plain decoding would see there, and speculation stays lossless.
"""

from __future__ import annotations

import torch

from .config import SamplingConfig


class TokenHistory:
    """What the penalties need of one sequence: output token counts (V,) and the tokens seen at all (V,)."""

    def __init__(self, prompt_ids: list[int], vocab_size: int, device: torch.device | str = "cpu"):
        self.counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)  # output tokens only
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)  # prompt and output
        self.seen[torch.tensor(prompt_ids, dtype=torch.long, device=device)] = True

    @classmethod
    def of(
        cls, prompt_ids: list[int], context: list[int], vocab_size: int, device: torch.device | str = "cpu"
    ) -> "TokenHistory":
        """The history of a context that opens with prompt_ids, the rest being output (what drafters see)."""
        history = cls(prompt_ids, vocab_size, device)
        history.extend(context[len(prompt_ids) :])
        return history

    def extend(self, tokens: list[int]) -> None:
        """Adds emitted output tokens."""
        if tokens:
            index = torch.tensor(tokens, dtype=torch.long, device=self.counts.device)
            self.counts.index_put_((index,), torch.ones(len(tokens), device=self.counts.device), accumulate=True)
            self.seen[index] = True

    def rows(self, draft_tokens: torch.Tensor, ancestors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Counts and seen sets for each scored row: (R, V) float32 and (R, V) bool.

        draft_tokens: (N,) the drafted tokens; ancestors: (R, N) bool, row r continues the text by the drafts
        marked in its row (a chain's row i: drafts 0..i-1; a tree's row: the nodes on its path).
        """
        R = ancestors.shape[0]
        counts = self.counts.expand(R, -1).clone()
        rows, nodes = ancestors.nonzero(as_tuple=True)
        if rows.numel():
            columns = draft_tokens.to(counts.device)[nodes.to(counts.device)]
            counts.index_put_(
                (rows.to(counts.device), columns), torch.ones(rows.numel(), device=counts.device), accumulate=True
            )
        return counts, self.seen | (counts > 0)


def chain_ancestors(k: int) -> torch.Tensor:
    """(k + 1, k) bool: row i of a chain of k drafts follows drafts 0..i-1."""
    return torch.ones(k + 1, k, dtype=torch.bool).tril(-1)


def tree_ancestors(parents: list[int]) -> torch.Tensor:
    """(N + 1, N) bool: row 0 (the root) follows no draft, row i + 1 follows node i and its ancestors."""
    from .verify import tree_mask

    return tree_mask(parents)[:, 1:]


def penalize(logits: torch.Tensor, counts: torch.Tensor, seen: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """logits (R, V), counts (R, V) of output tokens, seen (R, V) of prompt and output -> (R, V) float32.

    Example: logits [2, -1, 0], token 0 and 1 seen once, repetition penalty 2 -> [1, -2, 0].
    """
    x = logits.float().clone()
    if cfg.logit_bias:
        ids = torch.tensor([t for t, _ in cfg.logit_bias], dtype=torch.long, device=x.device)
        x[:, ids] += torch.tensor([b for _, b in cfg.logit_bias], dtype=torch.float32, device=x.device)
    if cfg.repetition_penalty != 1.0:
        penalized = torch.where(x > 0, x / cfg.repetition_penalty, x * cfg.repetition_penalty)
        # a penalty near 0 (or near 100 with huge logits) overflows float32: two infinite logits would make
        # softmax's (inf - inf) a NaN, so they stop at the largest finite value instead
        limit = torch.finfo(torch.float32).max
        x = torch.where(seen, penalized.clamp(-limit, limit), x)
    if cfg.frequency_penalty:
        x -= cfg.frequency_penalty * counts
    if cfg.presence_penalty:
        x -= cfg.presence_penalty * (counts > 0).float()
    return x


class SubsetPenalties:
    """A request's penalties over a drafter's reduced vocabulary (an EAGLE head's draft tokens), so that its
    drafts and confidence follow the penalized target: built once per proposal from the text so far."""

    def __init__(self, history: TokenHistory, columns: torch.Tensor, inverse: torch.Tensor, cfg: SamplingConfig):
        """columns (K,): the full-vocabulary id of each draft token; inverse (V,): a token's draft index, or -1."""
        from dataclasses import replace

        self.inverse = inverse
        self.counts, self.seen = history.counts[columns], history.seen[columns]  # (K,) each
        bias = [(int(inverse[t]), b) for t, b in cfg.logit_bias if int(inverse[t]) >= 0]
        self.cfg = replace(cfg, logit_bias=tuple(bias))

    def apply(self, logits: torch.Tensor, paths: list[list[int]]) -> torch.Tensor:
        """logits (F, K) of F draft rows, each continuing the text by its path (full-vocabulary ids) -> (F, K)."""
        counts = self.counts.expand(len(paths), -1).clone()
        for row, path in enumerate(paths):
            if path:
                index = self.inverse[torch.tensor(path)]
                index = index[index >= 0]
                counts[row].index_put_((index,), torch.ones(index.numel()), accumulate=True)
        return penalize(logits, counts, self.seen | (counts > 0), self.cfg)


def inverse_index(columns: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(V,) int64: each token's position in columns (K,), -1 where absent."""
    inverse = torch.full((vocab_size,), -1, dtype=torch.long)
    inverse[columns] = torch.arange(columns.numel())
    return inverse
