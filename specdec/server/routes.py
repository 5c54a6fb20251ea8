"""The HTTP endpoints: generation (completions, chat), models, health and metrics."""
from __future__ import annotations

import threading

from fastapi import APIRouter, Request
from starlette.responses import JSONResponse, Response

from .. import __version__
from .generation import generate
from .openapi import document

router = APIRouter()


@router.post("/v1/completions")
async def completions(request: Request):
    return await generate(request, "completions")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    return await generate(request, "chat")


@router.get("/v1/models")
async def models(request: Request):
    server = request.app.state.server
    data = [{"id": name, "object": "model", "created": server.started, "owned_by": "specdec",
             "max_model_len": server.limits.max_context}  # as vLLM's: the context, --max-context
            for name in server.limits.model_names]
    return {"object": "list", "data": data}


@router.get("/health")
async def health(request: Request):
    health = request.app.state.server.health()
    return JSONResponse(health, status_code=200 if health["status"] == "ok" else 503)


@router.get("/metrics")
async def metrics(request: Request):
    server = request.app.state.server
    threads = {"engine": server.worker.thread_ident, "http": threading.get_ident()}  # this handler's: the event loop
    return Response(server.metrics.exposition(threads), media_type=server.metrics.content_type)


@router.get("/openapi.json")
async def openapi(request: Request):
    return document(request.app.state.server.limits, __version__)
