"""Where the server's time goes: the engine thread's wall time by part, and the CPU time of its threads.

The engine thread's parts (WORKER_PARTS) cover its loop: waiting for work (idle), admitting requests (tokenizing
their prompts), the engine's own parts (BatchEngine.seconds: prefill passes, drafting, the step's target pass,
verification), turning step events into text (detokenization, stop strings, and the scheduler's bookkeeping
between its parts) and handing the events to the HTTP side. The worker adds them up as it runs; /metrics reads them at each scrape
(`specdec_engine_seconds_total{part}`), where `specdec bench-serve --profile` reads them before and after each run. The HTTP layer (uvicorn, the handlers, SSE framing) runs on the event loop's thread at the same time;
its CPU seconds, and the engine thread's, are read from the threads' own clocks at each scrape
(`specdec_thread_cpu_seconds{thread}`).
"""

from __future__ import annotations

import threading
import time

from ..scheduler import ENGINE_PARTS

WORKER_PARTS = ("idle", "admission", *ENGINE_PARTS, "text", "events")


class WorkerClock:
    """Cumulative seconds of the engine thread by part (WORKER_PARTS), written by that thread and read at each scrape
    of /metrics (totals, from the HTTP side: under a lock, the idle wait in progress included)."""

    def __init__(self, engine):
        self.engine = engine
        self.seconds = dict.fromkeys(WORKER_PARTS, 0.0)
        self._engine_seen = dict(engine.seconds)
        self._idle_since: float | None = None  # when the wait in progress began
        self._lock = threading.Lock()

    def add(self, part: str, since: float) -> float:
        """Adds the time from `since` (a perf_counter reading) to `part` (for "idle": ends the wait); returns now."""
        now = time.perf_counter()
        with self._lock:
            self.seconds[part] += now - since
            if part == "idle":
                self._idle_since = None
        return now

    def idle_from(self, since: float) -> None:
        """The thread waits for work from `since` on, until add("idle", since)."""
        with self._lock:
            self._idle_since = since

    def stepped(self, since: float, until: float) -> None:
        """A step of the stream core ran from `since` to `until`: the engine's parts as it counted them, the rest
        is text (detokenization, stop strings, bookkeeping)."""
        grew = {part: total - self._engine_seen.get(part, 0.0) for part, total in self.engine.seconds.items()}
        self._engine_seen = dict(self.engine.seconds)
        with self._lock:
            for part, seconds in grew.items():
                self.seconds[part] += seconds
            self.seconds["text"] += max(0.0, until - since - sum(grew.values()))

    def totals(self) -> dict[str, float]:
        """The seconds by part so far, the wait in progress included."""
        with self._lock:
            out = dict(self.seconds)
            if self._idle_since is not None:
                out["idle"] += time.perf_counter() - self._idle_since
        return out


def thread_cpu_seconds(thread_id: int | None) -> float | None:
    """The CPU seconds a live thread of this process has used (its own clock), or None (no such thread, or a
    platform without per-thread clocks)."""
    if thread_id is None:
        return None
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(thread_id))
    except (AttributeError, OSError, OverflowError, ValueError):
        return None
