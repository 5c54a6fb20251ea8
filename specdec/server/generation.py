"""The two generation endpoints' common flow: validate, admit, submit, then stream or collect."""
from __future__ import annotations

import json
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from . import responses
from .errors import APIError, bad_request
from .handle import ClientGone, RequestHandle
from .schemas import parse_request
from .worker import Delta

CLIENT_GONE = 499


class EventStream(StreamingResponse):
    """Server-sent events that run `on_close` however the stream ends (done, error, client gone)."""

    def __init__(self, content, on_close):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def generate(request: Request, endpoint: str):
    """POST /v1/completions (endpoint "completions") or /v1/chat/completions ("chat")."""
    arrived = time.perf_counter()
    server = request.app.state.server
    path = request.url.path
    try:
        parsed = parse_request(await _json(request, server.settings.max_body_bytes), endpoint, server.limits)
        server.admit()
    except APIError as exc:
        server.metrics.observe_request(path, exc.status)
        raise

    def on_close(status: int, handle: RequestHandle) -> None:
        server.release()
        latency = time.perf_counter() - handle.arrived if status == 200 else None
        server.metrics.observe_request(path, status, latency, handle.first_token_s)

    handle = RequestHandle(server.worker, request.receive, on_close, arrived)
    meta = responses.Meta(chat=endpoint == "chat", model=parsed.model)
    try:
        handle.submit(parsed)
        await handle.next()  # Started: the request holds a batch slot
        logprobs = responses.LogprobFormatter(server.worker.tokenizer) if parsed.config.logprobs is not None else None
        if parsed.stream:
            return EventStream(_stream(handle, meta, parsed.include_usage, logprobs), handle.close)
        deltas = [event async for event in handle.events() if isinstance(event, Delta)]
        handle.close(200)
        text = "".join(d.text for d in deltas)
        entries = [e for d in deltas for e in d.logprobs] if logprobs else None
        return JSONResponse(responses.response(meta, text, handle.finished,
                                               logprobs.format(meta.chat, entries) if logprobs else None))
    except APIError as exc:
        handle.close(exc.status)
        raise
    except ClientGone:
        handle.close(CLIENT_GONE)
        return JSONResponse({}, status_code=CLIENT_GONE)  # nobody reads it
    except BaseException:
        handle.close(500)
        raise


async def _stream(handle: RequestHandle, meta: responses.Meta, include_usage: bool,
                  logprobs: responses.LogprobFormatter | None):
    if meta.chat:
        yield responses.sse(responses.chunk(meta, None, role=True))
    try:
        async for event in handle.events():
            if isinstance(event, Delta):
                if event.text or (logprobs and event.logprobs):  # tokens whose text is held back keep their logprobs
                    yield responses.sse(responses.chunk(meta, event.text, logprobs=logprobs.format(
                        meta.chat, event.logprobs) if logprobs else None))
        yield responses.sse(responses.chunk(meta, None, handle.finished))
        if include_usage:
            yield responses.sse(responses.usage_chunk(meta, handle.finished))
    except ClientGone:
        return  # EventStream's on_close cancels the generation
    except APIError as exc:  # failed after the stream began: an error event, as OpenAI sends one
        yield responses.sse(exc.body())
    yield responses.DONE


async def _json(request: Request, limit: int):
    declared = request.headers.get("content-length", "")
    too_big = declared.isdigit() and int(declared) > limit  # refused before reading it
    body = b"" if too_big else await request.body()
    if too_big or len(body) > limit:
        raise APIError(413, f"The request body is larger than {limit} bytes", code="request_too_large")
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise bad_request("We could not parse the JSON body of your request: it is not valid JSON",
                          code="invalid_json") from None
