"""The FastAPI application: lifespan (the engine worker), API-key check, OpenAI-format errors, routes."""

from __future__ import annotations

import asyncio
import hmac
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import JSONResponse

from .. import __version__
from .document import openapi_document
from .errors import APIError, internal, too_large, unauthorized
from .metrics import ServerMetrics
from .routes import router
from .state import ServerSettings, ServerState
from .validation import api_error
from .worker import EngineWorker

log = logging.getLogger("specdec.server")
OPEN_PATHS = ("/health",)


def create_app(decoder, settings: ServerSettings) -> FastAPI:
    """An app serving `decoder` (a loaded SpecDecoder); the worker thread runs while the app does."""
    metrics = ServerMetrics()
    worker = EngineWorker(
        decoder,
        settings.max_batch,
        metrics,
        settings.max_prefill_tokens,
        settings.drafter_options,
        prefill_chunk=settings.prefill_chunk,
    )
    metrics.watch_engine(worker.clock.totals)
    server = ServerState(settings, worker, metrics)

    @asynccontextmanager
    async def lifespan(app):
        server.worker.start()
        yield
        server.draining = True
        await asyncio.to_thread(server.worker.stop)

    app = FastAPI(title="specdec", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.server = server
    document = openapi_document(server.limits, __version__)
    app.openapi = lambda: document  # type: ignore[method-assign]
    # not FastAPI's max_body_size: Starlette's limit answers a declared Content-Length in plain text, not OpenAI's
    app.add_middleware(BodyLimitMiddleware, limit=settings.max_body_bytes, metrics=metrics)
    if settings.api_key:
        app.add_middleware(ApiKeyMiddleware, key=settings.api_key)
    _install_error_handlers(app)
    app.include_router(router)
    return app


def error_response(exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


class ApiKeyMiddleware:
    """Answers 401 unless `Authorization: Bearer KEY` is sent (every path but /health)."""

    def __init__(self, app, key: str):
        self.app = app
        self.expected = f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            sent = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(sent, self.expected):
                await error_response(unauthorized())(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Answers 413 to a POST whose body is larger than `limit` bytes: by its Content-Length before reading it,
    else once more than that has arrived. The body read is handed on to the app whole; what `receive` brings after
    it (a disconnect) is passed on as it comes, since the handlers watch for it."""

    def __init__(self, app, limit: int, metrics):
        self.app, self.limit, self.metrics = app, limit, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"")
        too_big = declared.isdigit() and int(declared) > self.limit  # refused before reading it
        chunks, received = [], 0
        while not too_big:
            message = await receive()
            if message["type"] != "http.request":
                break  # the client left while sending: the app reads a short body, then the disconnect
            chunks.append(message.get("body", b""))
            received += len(chunks[-1])
            too_big = received > self.limit
            if not message.get("more_body", False):
                break
        if too_big:
            self.metrics.observe_request(scope["path"], 413)
            await error_response(too_large(self.limit))(scope, receive, send)
            return
        body, handed = b"".join(chunks), False

        async def replay():
            nonlocal handed
            if handed:
                return await receive()
            handed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def known_error(request, exc: APIError):
        return error_response(exc)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        message = {
            404: f"Not found: {request.url.path}",
            405: f"Method {request.method} not allowed on {request.url.path}",
        }.get(exc.status_code, str(exc.detail))
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, message, kind, code=code))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc: RequestValidationError):
        error = api_error(list(exc.errors()))  # the body's fields: as a 400 naming the field
        request.app.state.server.metrics.observe_request(request.url.path, error.status)
        return error_response(error)

    @app.exception_handler(Exception)
    async def unexpected(request, exc: Exception):
        log.error("unexpected error on %s", request.url.path, exc_info=exc)
        return error_response(internal())
