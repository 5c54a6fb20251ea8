"""The OpenAI protocol's answers as pydantic models: completions, chat completions, their stream chunks, the model
list and the error body. The OpenAPI document shows them; responses.py writes the objects (as plain dicts, in the
hot loop of a stream) and tests/test_server_protocol.py holds every object a real server sends to these models,
which refuse fields they do not name."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SpeculationStats(Closed):
    """specdec's extension: what speculation did for a choice (a chunk) or a request (usage)."""

    drafter: str
    num_speculative_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    mean_accepted_tokens: float | None
    verify_steps: int
    drafting_steps: int
    mean_acceptance_length: float | None
    acceptance: str
    lossy: bool
    drafter_steps: dict[str, int] | None = None  # the select drafter's: steps drafted by each candidate


class PromptTokensDetails(Closed):
    cached_tokens: int


class Usage(Closed):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    speculation: SpeculationStats


class FunctionCallOut(Closed):
    name: str | None = None
    arguments: str


class ToolCallOut(Closed):
    index: int | None = None  # in stream deltas
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionCallOut


class AssistantMessage(Closed):
    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCallOut] | None = None


class Delta(Closed):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallOut] | None = None


class Head(Closed):
    id: str
    created: int
    model: str


class CompletionChoice(Closed):
    index: int
    text: str
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class CompletionResponse(Head):
    """POST /v1/completions; with stream: true, a stream of these (object text_completion too) ending in
    [DONE], the last one (with stream_options.include_usage) without choices, carrying the usage."""

    object: Literal["text_completion"]
    choices: list[CompletionChoice]
    usage: Usage | None = None
    speculation: SpeculationStats | None = None  # a streamed chunk that finishes a choice


class ChatChoice(Closed):
    index: int
    message: AssistantMessage
    logprobs: dict[str, Any] | None
    finish_reason: str


class ChatCompletionResponse(Head):
    """POST /v1/chat/completions without stream."""

    object: Literal["chat.completion"]
    choices: list[ChatChoice]
    usage: Usage


class ChunkChoice(Closed):
    index: int
    delta: Delta
    logprobs: dict[str, Any] | None
    finish_reason: str | None


class ChatCompletionChunk(Head):
    """One server-sent event of POST /v1/chat/completions with stream: true (the stream ends in [DONE])."""

    object: Literal["chat.completion.chunk"]
    choices: list[ChunkChoice]
    usage: Usage | None = None
    speculation: SpeculationStats | None = None


class ModelCard(Closed):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    max_model_len: int  # as vLLM's: the server's context (--max-context)


class ModelList(Closed):
    """GET /v1/models."""

    object: Literal["list"]
    data: list[ModelCard]


class ErrorDetail(Closed):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Closed):
    """Every error: a 4xx (the client's) or a 5xx, in OpenAI's format."""

    error: ErrorDetail
