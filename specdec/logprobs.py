"""The target's log-probabilities of the tokens it emits, for requests that ask for them.

Every emitted token, drafted and accepted or the target's own, was scored by a target pass: row j of the
verify pass holds the distribution it was chosen from. So logprobs cost no extra pass and are the same with
or without speculation (bit for bit on the batch-invariant kernels). By default they are the log-softmax of the
target's raw logits, before temperature, penalties and top-k/top-p/min-p (vLLM's default, "raw logprobs"); with
logprobs_mode "processed", of the distribution the token was drawn from (penalties, the constraint's mask, then
temperature and the filters; greedy requests at temperature 1); tokens filtered out are not listed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import SamplingConfig
from .sampling import warp_logits


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    logprob: float | None  # None only for a prompt's first token, which nothing predicts
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob) of the most likely tokens, most likely first


def logprob_logits(raw: torch.Tensor, processed: torch.Tensor, mode: str, sampling: SamplingConfig) -> torch.Tensor:
    """The logits (R, V) whose log-softmax a request's logprobs are: the raw ones (mode "raw"), or (mode
    "processed") those its tokens are drawn from: the processed ones, warped by the sampler chain when sampling."""
    if mode == "raw":
        return raw
    return processed.float() if sampling.greedy else warp_logits(processed.float(), sampling)


def prompt_logprobs(logits: torch.Tensor, prompt: list[int], top: int) -> list[TokenLogprob]:
    """logits (len(prompt), V) of a prefill (row j predicts prompt[j + 1]) -> one entry per prompt token."""
    return [TokenLogprob(prompt[0], None)] + token_logprobs(logits, prompt[1:], top)


def token_logprobs(logits: torch.Tensor, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits (R, V), row j the distribution tokens[j] was drawn from (R >= len(tokens)); top: alternatives
    to list per token (0 to MAX_TOP_LOGPROBS)."""
    if not tokens:
        return []
    logp = torch.log_softmax(logits[: len(tokens)].float(), dim=-1)  # (n, V)
    ids = torch.tensor(tokens, device=logp.device).unsqueeze(1)
    chosen = logp.gather(1, ids).squeeze(1).tolist()
    if top <= 0:
        return [TokenLogprob(t, lp) for t, lp in zip(tokens, chosen)]
    values, indices = logp.topk(min(top, logp.shape[-1]), dim=-1)
    return [
        TokenLogprob(t, lp, tuple((a, b) for a, b in zip(i, v) if b != float("-inf")))
        for t, lp, i, v in zip(tokens, chosen, indices.tolist(), values.tolist())
    ]
