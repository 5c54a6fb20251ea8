"""Chunked prefill: how much of the waiting prompts a step prefills while other requests are running.

A long prompt prefilled in one pass stalls every running stream for that pass (seconds, for a few thousand tokens
on a CPU). With a budget, a step prefills at most that many prompt tokens: the prompts that fit whole start
decoding, and the first that does not fit is prefilled in part (a chunk), to go on at the next step. On a backend
whose chunks compute what one pass would (CausalLM.exact_chunks: the CPU kernels, which are batch-invariant) the
output is the same, token for token, greedy or sampled with a seed.

The budget is a number of tokens, or "auto": a chunk that takes about CHUNK_OVER_STEP times the running batch's step
(MIN_CHUNK_TOKENS at least), so that a step with a chunk costs at most about 2.5 times one without (measured as the
engine runs: the step's seconds and the seconds a prefilled token takes, each a moving average). Where more requests
wait than run, the chunk grows in proportion: each step's delay, borne by the running streams, then buys as much for
the waiting ones (a burst of arrivals over a small batch is prefilled quickly; a long prompt beside a full batch is
prefilled a short chunk a step). Where nothing else runs, nobody waits: prompts are prefilled whole.

A request whose drafter reads the target's features (EAGLE and Medusa heads) is chunked too: each chunk's pass
returns its rows' features, which the drafter observes in order, as it would the whole prompt's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from .drafter_features import observe_prompt_features
from .request import Request, pass_feature_layers

AUTO = "auto"
FIRST_GUESS_TOKENS = 64  # auto's budget before a step and a prefill were timed
# auto's smallest chunk: a chunk's pass reads every weight again, which smaller ones would spend most of their time on.
# Not larger: over a 4-bit file a step of 16 streams takes about 15 ms and a prompt token 0.5 ms, or 1.4 ms with
# 1,800 tokens before it (attention), so 64 tokens were 2 to 7 steps' time wherever the rule asked for fewer
MIN_CHUNK_TOKENS = 16
MIN_TIMED_TOKENS = 16  # a pass of fewer prompt tokens is mostly its fixed cost: not timed as a token's
MAX_CHUNK_TOKENS = 2048
CHUNK_OVER_STEP = 1.5  # auto's chunk, in running steps' time, while no more requests wait than run
SMOOTHING = 0.2  # weight of the newest timing in the moving averages


def parse_prefill_chunk(value) -> int | str | None:
    """A budget from the command line or the API: "auto", "off" / None (prompts whole) or a number of tokens >= 1."""
    from .errors import ConfigError

    if value is None or value == "off":
        return None
    if value == AUTO:
        return AUTO
    try:
        tokens = int(value)
    except (TypeError, ValueError):
        tokens = 0
    if isinstance(value, bool) or tokens < 1 or str(tokens) != str(value).strip():
        raise ConfigError(f"prefill chunk must be 'auto', 'off' or a number of tokens >= 1, got {value!r}")
    return tokens


@dataclass
class PrefillPlan:
    """What a step prefills of the waiting requests (indexes into them, in arrival order)."""

    due: list[int]  # prefilled to their end this step: they start decoding
    chunk: tuple[int, int] | None = None  # (index, tokens): one prompt prefilled in part


def plan_prefill(left: list[int], chunkable: list[bool], budget: int | None) -> PrefillPlan:
    """left: the prompt tokens each waiting request still has to prefill; chunkable: whether it may be prefilled in
    parts (a request that wants every prompt row's logits or features is not); budget: tokens this step (None: all).
    First come, first served: a request never waits behind one that arrived later. A request that cannot be
    chunked and does not fit is prefilled whole, alone, at a step that has prefilled nothing else."""
    if budget is None:
        return PrefillPlan(due=list(range(len(left))))
    due, room = [], budget
    for i, (n, parts) in enumerate(zip(left, chunkable)):
        if n <= room:
            due.append(i)
            room -= n
        elif not parts:
            if not due:
                due.append(i)
            break
        else:
            return PrefillPlan(due, (i, room) if room > 0 else None)
    return PrefillPlan(due)


class ChunkBudget:
    """The tokens of prompt a step may prefill while other requests run: fixed, or auto (see the module)."""

    def __init__(self, setting: int | str):
        self.fixed = None if setting == AUTO else int(setting)
        self.step_s: float | None = None  # a decoding step of the running batch, without prefill
        self.token_s: float | None = None  # one prompt token of a prefill pass

    def tokens(self, waiting: int = 1, running: int = 1) -> int:
        """This step's budget, with `waiting` requests waiting to be prefilled and `running` decoding."""
        if self.fixed is not None:
            return self.fixed
        if self.step_s is None or self.token_s is None or self.token_s <= 0:
            return FIRST_GUESS_TOKENS
        steps = max(CHUNK_OVER_STEP, waiting / max(running, 1))
        return max(MIN_CHUNK_TOKENS, min(MAX_CHUNK_TOKENS, int(steps * self.step_s / self.token_s)))

    def observe_step(self, seconds: float) -> None:
        self.step_s = _average(self.step_s, seconds)

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        if tokens >= MIN_TIMED_TOKENS:
            self.token_s = _average(self.token_s, seconds / tokens)


def _average(mean: float | None, value: float) -> float:
    return value if mean is None else (1 - SMOOTHING) * mean + SMOOTHING * value


@dataclass
class Chunk:
    """A prompt prefilled in part this step: the next `size` of its tokens after those its cache holds. It rides in
    the pass of the prompts whose prefill ends this step (join), or takes a pass of its own (prefill_alone); either
    way its cache is then marked in_prompt, so that its next pass goes on with its prefill."""

    request: Request
    size: int

    def tokens(self) -> torch.Tensor:
        start = self.request.cache.length
        return torch.tensor(self.request.tokens[start : start + self.size])

    def join(self, caches: list, inputs: list) -> None:
        """Adds its cache and tokens to a prefill pass's (its last row's logits go unread)."""
        caches.append(self.request.cache)
        inputs.append(self.tokens())

    def prefilled(self, hidden: torch.Tensor | None = None, layers: tuple[int, ...] | None = None) -> None:
        """After its pass: its cache marked in_prompt; a drafter that reads features observes its rows' (hidden,
        for the pass's feature `layers`)."""
        self.request.cache.in_prompt = True
        if self.request.needs_features:
            observe_prompt_features(self.request, hidden, layers)

    def prefill_alone(self, backend: Any) -> float:
        """Its pass, for its keys and values (and its rows' features, for a drafter that reads them); returns the
        pass's seconds. backend: the target's CausalLM."""
        layers = pass_feature_layers([self.request])
        t0 = time.perf_counter()
        (out,) = backend.forward_batch(
            [self.request.cache],
            [self.tokens()],
            last_only=True,
            argmax_only=True,
            output_hidden=layers is not None,
            feature_layers=layers or (),
        )
        seconds = time.perf_counter() - t0
        self.prefilled(out.hidden, layers)
        return seconds


def take_due(waiting: list, chunks: ChunkBudget, running: int) -> tuple[list, list, Chunk | None]:
    """This step's prefill under the chunk budget while `running` others decode, over `waiting` ((id, Request) pairs
    in arrival order): (those whose prefill ends this step, those left waiting, and the chunk of the next one in line
    or None)."""
    requests = [r for _, r in waiting]
    left = [len(r.tokens) - r.cache.length for r in requests]
    chunkable = [not r.prefill_all_logits for r in requests]
    plan = plan_prefill(left, chunkable, chunks.tokens(len(waiting), running))
    due = [w for i, w in enumerate(waiting) if i in plan.due]
    rest = [w for i, w in enumerate(waiting) if i not in plan.due]
    return due, rest, Chunk(requests[plan.chunk[0]], plan.chunk[1]) if plan.chunk else None
