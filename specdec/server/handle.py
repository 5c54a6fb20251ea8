"""A request's asyncio end: its choices' events in order, disconnect detection, and cancellation."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Callable, cast

from .errors import APIError
from .events import Delta, Failed, Finished, Job


class ClientGone(Exception):
    """The client disconnected before the request ended."""


_GONE = object()  # queued after the events that came before the client went away


async def _disconnect(receive, queue: asyncio.Queue) -> None:
    """Queues _GONE when the ASGI server reports that the client went away (the body has been read)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a broken connection is a gone client too
        pass
    queue.put_nowait(_GONE)


class RequestHandle:
    """Submits one request's choices (OpenAI's `n`) to the worker and iterates over their events until every
    choice has finished.

    `close()` runs exactly once however the request ends; unfinished choices are cancelled in the engine (their
    KV slots freed) and `on_close(status, handle)` does the accounting.
    """

    def __init__(
        self, worker, receive, on_close: Callable[[int, "RequestHandle"], None], arrived: float, choices: int = 1
    ):
        self.ids = [f"req-{uuid.uuid4().hex}" for _ in range(choices)]  # one engine request per choice
        self.worker = worker
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrived = arrived  # perf_counter() when the request came in
        self.first_token_s: float | None = None
        self.finished: list[Finished | None] = [None] * choices  # each choice's, once it has finished
        self.failed: APIError | None = None
        self.on_close = on_close
        # one queue for the events and the disconnect, so that waiting for the next event is one await, not a task
        # and a wait over two futures per event
        self._gone = asyncio.ensure_future(_disconnect(receive, self.queue))
        self._left = False  # the client went away
        self._closed = False

    def results(self) -> list[Finished]:
        """Every choice's Finished, once all have finished."""
        done = [f for f in self.finished if f is not None]
        if len(done) != len(self.finished):
            raise RuntimeError("a request's results were read before all its choices finished")
        return done

    def submit(self, requests: list) -> None:
        """One GenerationRequest per choice."""
        for index, (request_id, request) in enumerate(zip(self.ids, requests)):
            self.worker.submit(Job(request_id, request, functools.partial(self.emit, index)))

    def emit(self, index: int, event) -> None:
        """Called from the worker thread."""
        self.worker.outbox.hand(self.loop, self.queue.put_nowait, (index, event))

    @property
    def done(self) -> bool:
        return all(self.finished)

    async def next(self) -> tuple[int, object]:
        """(choice index, the next event: Started, Delta or Finished); raises the APIError of a Failed, or
        ClientGone."""
        item = _GONE if self._left else await self.queue.get()  # a queue with items returns without suspending
        if item is _GONE:
            self._left = True
            raise ClientGone()
        index, event = cast(tuple[int, object], item)
        if isinstance(event, Failed):
            self.failed = event.error
            raise event.error
        if isinstance(event, Delta) and event.tokens and self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.arrived
        if isinstance(event, Finished):
            self.finished[index] = event
        return index, event

    async def events(self):
        """(index, event) pairs until every choice's Finished."""
        while not self.done:
            yield await self.next()

    @property
    def status(self) -> int:
        """The HTTP status that describes how the request ended (499: the client went away)."""
        return 200 if self.done else self.failed.status if self.failed else 499

    def close(self, status: int | None = None) -> None:
        """`status` defaults to self.status."""
        if self._closed:
            return
        self._closed = True
        self._gone.cancel()
        for request_id, fin in zip(self.ids, self.finished):
            if fin is None:
                self.worker.cancel(request_id)
        self.on_close(self.status if status is None else status, self)
