"""Events from the engine thread to the asyncio side: while a step delivers its events, they are held and handed to
each event loop together, in order, with one wake-up of the loop (loop.call_soon_threadsafe) instead of one an
event. Each wake-up writes to the loop's self-pipe, a system call that releases the GIL, so the HTTP thread woken by
the first event of a step could take the GIL while the engine thread still had the others to hand over."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable


class Outbox:
    """The engine worker's: request handles hand their events over through it (hand), and each step's delivery
    holds them (holding)."""

    def __init__(self):
        self._held: list[tuple] | None = None
        self._holder: int | None = None  # the thread that holds, while one does

    def hand(self, loop, callback: Callable, arg) -> None:
        """Runs callback(arg) on the event loop `loop`: at once, or at the end of holding() when the calling
        thread holds. After the loop has closed (shutdown) nothing runs."""
        if self._held is not None and threading.get_ident() == self._holder:
            self._held.append((loop, callback, arg))
            return
        _call_soon(loop, callback, arg)

    @contextmanager
    def holding(self) -> Iterator[None]:
        """Holds what the calling thread hands over until the block ends (however it ends), then hands it over."""
        self._held, self._holder = [], threading.get_ident()
        try:
            yield
        finally:
            held, self._held, self._holder = self._held, None, None
            by_loop: dict = {}
            for loop, callback, arg in held:
                by_loop.setdefault(loop, []).append((callback, arg))
            for loop, calls in by_loop.items():
                _call_soon(loop, _run_all, calls)


def _call_soon(loop, callback: Callable, arg) -> None:
    try:
        loop.call_soon_threadsafe(callback, arg)
    except RuntimeError:  # the event loop has closed (shutdown)
        pass


def _run_all(calls: list[tuple]) -> None:
    for callback, arg in calls:
        callback(arg)
