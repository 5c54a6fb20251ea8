"""The two generation endpoints' common flow: validate, admit, submit, then stream or collect.

A request with `n` > 1 runs as n engine requests over the same prompt (one batch slot each, seeds seed,
seed + 1, ... when a seed is given), merged into one response whose choices carry their index.
"""

from __future__ import annotations

import time
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse

from . import responses
from .errors import APIError
from .handle import ClientGone, RequestHandle
from .protocol import ChatRequest, CompletionsRequest
from .binding import bind
from .schemas import GenerationRequest
from .tools import CALL_TAG, ToolCalling, tool_call
from .events import Delta, Finished

CLIENT_GONE = 499


class EventStream(StreamingResponse):
    """Server-sent events that run `on_close` however the stream ends (done, error, client gone)."""

    def __init__(self, content, on_close):
        super().__init__(
            content, media_type="text/event-stream", headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        )
        self.on_close = on_close

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def generate(request: Request, body: ChatRequest | CompletionsRequest):
    """POST /v1/completions or /v1/chat/completions, the body validated by the protocol's models."""
    arrived = time.perf_counter()
    server = request.app.state.server
    path = request.url.path
    try:
        parsed = bind(body, server.limits)
        server.admit(parsed.n)
    except APIError as exc:
        server.metrics.observe_request(path, exc.status)
        raise

    def on_close(status: int, handle: RequestHandle) -> None:
        server.release(parsed.n)
        latency = time.perf_counter() - handle.arrived if status == 200 else None
        server.metrics.observe_request(path, status, latency, handle.first_token_s)

    handle = RequestHandle(server.worker, request.receive, on_close, arrived, choices=parsed.n)
    meta = responses.Meta(chat=parsed.endpoint == "chat", model=parsed.model)
    wants_logprobs = parsed.config.logprobs is not None
    formatters = [
        responses.LogprobFormatter(server.worker.tokenizer) if wants_logprobs else None for _ in range(parsed.n)
    ]
    echo = _echo_text(parsed, server.worker.tokenizer)
    try:
        handle.submit(_choices(parsed))
        await handle.next()  # the first Started: the request holds a batch slot (its choices share the prompt)
        if parsed.stream:
            return EventStream(
                _stream(handle, meta, parsed.include_usage, formatters, echo, parsed.tool_calling), handle.close
            )
        deltas: list[list[Delta]] = [[] for _ in range(parsed.n)]
        async for index, event in handle.events():
            if isinstance(event, Delta):
                deltas[index].append(event)
        handle.close(200)
        texts = [(echo or "") + "".join(d.text for d in ds) for ds in deltas]
        logprobs = [
            f.format(meta.chat, (ds[0].prompt_logprobs or []) + [e for d in ds for e in d.logprobs or []])
            if f
            else None
            for f, ds in zip(formatters, deltas)
        ]  # prompt logprobs come with echo only
        calling = parsed.tool_calling
        results = handle.results()
        answers = (
            [calling.answer(text, fin.finish_reason) for text, fin in zip(texts, results)]
            if calling is not None and calling.calls
            else None
        )
        return JSONResponse(responses.response(meta, list(zip(texts, results, logprobs)), answers))
    except APIError as exc:
        handle.close(exc.status)
        raise
    except ClientGone:
        handle.close(CLIENT_GONE)
        return JSONResponse({}, status_code=CLIENT_GONE)  # nobody reads it
    except BaseException:
        handle.close(500)
        raise


def _echo_text(parsed: GenerationRequest, tokenizer) -> str | None:
    """The prompt as the response echoes it (completions with echo), else None."""
    if not parsed.echo:
        return None
    return parsed.prompt if isinstance(parsed.prompt, str) else tokenizer.decode(parsed.prompt)


def _choices(parsed: GenerationRequest) -> list[GenerationRequest]:
    """One engine request per choice; with a seed, choice i samples with seed + i (distinct, reproducible)."""
    sampling = parsed.config.sampling
    if parsed.n == 1 or sampling.seed is None:
        return [parsed] * parsed.n
    return [
        replace(parsed, config=replace(parsed.config, sampling=replace(sampling, seed=(sampling.seed + i) % 2**63)))
        for i in range(parsed.n)
    ]


async def _stream(
    handle: RequestHandle,
    meta: responses.Meta,
    include_usage: bool,
    formatters: list[responses.LogprobFormatter | None],
    echo: str | None,
    calling: ToolCalling | None = None,
):
    if meta.chat:
        for index in range(len(formatters)):
            yield responses.sse(responses.chunk(meta, None, role=True, index=index))
    echoed: set[int] = set()
    calls = _ToolCallStream(meta, calling, len(formatters)) if calling is not None and calling.calls else None
    try:
        async for index, event in handle.events():
            if calls is not None:
                for out in calls.events(index, event):
                    yield responses.sse(out)
                continue
            formatter = formatters[index]
            if isinstance(event, Delta) and echo is not None and index not in echoed:  # the prompt comes first
                echoed.add(index)
                yield responses.sse(
                    responses.chunk(
                        meta,
                        echo,
                        index=index,
                        logprobs=formatter.format(meta.chat, event.prompt_logprobs) if formatter else None,
                    )
                )
            if isinstance(event, Delta):
                if event.text or (formatter and event.logprobs):  # tokens whose text is held back keep their logprobs
                    yield responses.sse(
                        responses.chunk(
                            meta,
                            event.text,
                            index=index,
                            logprobs=formatter.format(meta.chat, event.logprobs) if formatter else None,
                        )
                    )
            elif isinstance(event, Finished):
                yield responses.sse(responses.chunk(meta, None, event, index=index))
        if include_usage:
            yield responses.sse(responses.usage_chunk(meta, handle.results()))
    except ClientGone:
        return  # EventStream's on_close cancels the generation
    except APIError as exc:  # failed after the stream began: an error event, as OpenAI sends one
        yield responses.sse(exc.body())
    yield responses.DONE


class _ToolCallStream:
    """Streamed answers of a request that may call tools: a named function's arguments stream as they are
    generated; an "auto" answer streams as content up to where a call may begin (CALL_TAG, held back while the
    text could be opening it), the rest is read at the end; a "required" call is read whole at the end (which tool
    it is is only known then). Calls go out as tool call deltas."""

    def __init__(self, meta: responses.Meta, calling: ToolCalling, choices: int):
        self.meta, self.calling = meta, calling
        self.texts = [""] * choices
        self.sent = [0] * choices  # characters of each text already streamed as content ("auto")
        self.opened: set[int] = set()  # choices whose named call has been announced

    def events(self, index: int, event):
        """The chunks for one engine event of choice `index`."""
        meta, calling = self.meta, self.calling
        if isinstance(event, Delta):
            self.texts[index] += event.text
            if calling.choice == "auto":
                text = self.texts[index]
                opened = text.find(CALL_TAG, self.sent[index])
                safe = opened if opened >= 0 else _before_partial_tag(text)
                if safe > self.sent[index]:
                    yield responses.chunk(meta, text[self.sent[index] : safe], index=index)
                    self.sent[index] = safe
            if calling.choice == "function" and event.text:
                if index not in self.opened:  # the call opens with its id and name
                    self.opened.add(index)
                    yield responses.chunk(
                        meta, None, index=index, tool_calls=[{"index": 0, **tool_call(calling.function or "", "")}]
                    )
                yield responses.chunk(
                    meta, None, index=index, tool_calls=[{"index": 0, "function": {"arguments": event.text}}]
                )
        elif isinstance(event, Finished):
            if calling.choice == "function":
                reason = "tool_calls" if event.finish_reason != "length" else "length"
            else:
                content, calls, reason = calling.answer(self.texts[index][self.sent[index] :], event.finish_reason)
                if content:
                    yield responses.chunk(meta, content, index=index)
                if calls:
                    yield responses.chunk(
                        meta, None, index=index, tool_calls=[{"index": j, **call} for j, call in enumerate(calls)]
                    )
            yield responses.chunk(meta, None, event, index=index, finish_reason=reason)


def _before_partial_tag(text: str) -> int:
    """Where a suffix of `text` that could open CALL_TAG begins (len(text) when none could)."""
    for n in range(min(len(CALL_TAG) - 1, len(text)), 0, -1):
        if text.endswith(CALL_TAG[:n]):
            return len(text) - n
    return len(text)
