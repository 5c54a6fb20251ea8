"""What the engine worker tells a request's handler (Started, Delta, Finished, Failed), and the Job it is handed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..logprobs import TokenLogprob
from ..metrics import GenerationMetrics
from .errors import APIError
from .schemas import GenerationRequest


@dataclass
class Started:
    prompt_tokens: int


@dataclass
class Delta:
    text: str  # may be empty: text held back (a possible stop string, a split character)
    tokens: int  # tokens this step produced
    logprobs: list[TokenLogprob] | None = None  # those tokens' logprobs, when the request asked for them
    prompt_logprobs: list[TokenLogprob] | None = None  # on the first Delta: the prompt's, when asked for


@dataclass
class Finished:
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    prompt_tokens: int
    completion_tokens: int
    metrics: GenerationMetrics
    drafter: str
    num_speculative_tokens: int  # the most drafted per step for this request


@dataclass
class Failed:
    error: APIError


@dataclass
class Job:
    request_id: str
    request: GenerationRequest
    emit: Callable[[object], None]  # hands one event to the request's handler; callable from any thread
