"""The HTTP endpoints: generation (completions, chat), models, health and metrics. The generation endpoints take
their bodies as the protocol's models (protocol.py), which FastAPI validates and documents."""

from __future__ import annotations

import threading
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from .generation import generate
from .protocol import ChatRequest, CompletionsRequest
from .protocol_responses import (
    ChatCompletionChunk,
    ChatCompletionResponse,
    CompletionResponse,
    ErrorResponse,
    ModelList,
)

router = APIRouter()
ERRORS: dict[int | str, dict[str, Any]] = {"4XX": {"model": ErrorResponse, "description": "an OpenAI error"}}
STREAM = "; with stream: true, server-sent events ending in [DONE]"


def _answers(model: type, description: str, chunk: type | None = None) -> dict[int | str, dict[str, Any]]:
    content = {"text/event-stream": {"schema": {"$ref": f"#/components/schemas/{chunk.__name__}"}}} if chunk else {}
    return {200: {"model": model, "description": description, "content": content}, **ERRORS}


@router.post(
    "/v1/completions",
    summary="a text completion",
    response_model=None,
    responses=_answers(CompletionResponse, "the completion" + STREAM, CompletionResponse),
)
async def completions(body: CompletionsRequest, request: Request):
    return await generate(request, body)


@router.post(
    "/v1/chat/completions",
    summary="a chat completion",
    response_model=None,
    responses=_answers(ChatCompletionResponse, "the chat completion" + STREAM, ChatCompletionChunk),
)
async def chat_completions(body: ChatRequest, request: Request):
    return await generate(request, body)


@router.get("/v1/models", summary="the served model names", response_model=ModelList, responses=ERRORS)
async def models(request: Request):
    server = request.app.state.server
    data = [
        {
            "id": name,
            "object": "model",
            "created": server.started,
            "owned_by": "specdec",
            "max_model_len": server.limits.max_context,
        }  # as vLLM's: the context, --max-context
        for name in server.limits.model_names
    ]
    return {"object": "list", "data": data}


@router.get("/health", summary="liveness and capacity (503 while not ready)")
async def health(request: Request):
    health = request.app.state.server.health()
    return JSONResponse(health, status_code=200 if health["status"] == "ok" else 503)


@router.get("/metrics", summary="Prometheus metrics (the text exposition format)", responses=ERRORS)
async def metrics(request: Request):
    server = request.app.state.server
    threads = {"engine": server.worker.thread_ident, "http": threading.get_ident()}  # this handler's: the event loop
    return Response(server.metrics.exposition(threads), media_type=server.metrics.content_type)
