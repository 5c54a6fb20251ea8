"""A request's asyncio end: the worker's events in order, disconnect detection, and its cancellation."""
from __future__ import annotations

import asyncio
import time
import uuid
from typing import Callable

from .errors import APIError
from .worker import Delta, Failed, Finished, Job


class ClientGone(Exception):
    """The client disconnected before the request ended."""


async def _disconnect(receive) -> None:
    """Returns when the ASGI server reports that the client went away (the body has been read)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:  # a broken connection is a gone client too
        return


class RequestHandle:
    """Submits one request to the worker and iterates over its events until Finished.

    `close()` runs exactly once however the request ends; an unfinished request is cancelled in the
    engine (its KV slot freed) and `on_close(status, handle)` does the accounting.
    """

    def __init__(self, worker, receive, on_close: Callable[[int, "RequestHandle"], None], arrived: float):
        self.id = f"req-{uuid.uuid4().hex}"
        self.worker = worker
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrived = arrived  # perf_counter() when the request came in
        self.first_token_s: float | None = None
        self.finished: Finished | None = None
        self.failed: APIError | None = None
        self.on_close = on_close
        self._gone = asyncio.ensure_future(_disconnect(receive))
        self._closed = False

    def submit(self, request) -> None:
        self.worker.submit(Job(self.id, request, self.emit))

    def emit(self, event) -> None:
        """Called from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the event loop has closed (shutdown)
            pass

    async def next(self):
        """The next event (Started, Delta, Finished); raises the APIError of a Failed, or ClientGone."""
        if self.queue.empty():
            get = asyncio.ensure_future(self.queue.get())
            done, _ = await asyncio.wait({get, self._gone}, return_when=asyncio.FIRST_COMPLETED)
            if get not in done:
                get.cancel()
                raise ClientGone()
            event = get.result()
        else:
            event = self.queue.get_nowait()
        if isinstance(event, Failed):
            self.failed = event.error
            raise event.error
        if isinstance(event, Delta) and event.tokens and self.first_token_s is None:
            self.first_token_s = time.perf_counter() - self.arrived
        if isinstance(event, Finished):
            self.finished = event
        return event

    async def events(self):
        """Delta events, then the Finished one."""
        while self.finished is None:
            yield await self.next()

    @property
    def status(self) -> int:
        """The HTTP status that describes how the request ended (499: the client went away)."""
        return 200 if self.finished else self.failed.status if self.failed else 499

    def close(self, status: int | None = None) -> None:
        """`status` defaults to self.status."""
        if self._closed:
            return
        self._closed = True
        self._gone.cancel()
        if self.finished is None:
            self.worker.cancel(self.id)
        self.on_close(self.status if status is None else status, self)
