"""The engine's step loop in one background thread: the only code that touches the BatchEngine.

Submissions and cancellations arrive through a thread-safe inbox. A request waits in `pending` until
the batch has a free slot, joins between steps (continuous batching) and leaves, its KV slot freed,
as soon as it finishes or is cancelled. Newcomers are prefilled from the step they join; at most
`max_prefill_tokens` prompt tokens join per step (at least one request), so that a burst of prompts does not pad
one huge ragged pass, and the engine prefills a long prompt in chunks while others run (`prefill_chunk`,
prefill.py), so that it stalls no running stream for long. A request's
events (Started, Delta, Finished, Failed) leave through its own `emit` callback, which the asyncio
side makes thread-safe (loop.call_soon_threadsafe).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from typing import Callable

from ..choice import OWN_DRAFTER, PLAIN, DrafterChoice
from ..config import Acceptance
from ..stream_core import TextSteps, TextUpdate
from ..errors import ContextLengthError, SpecdecError
from ..request import Request
from .errors import APIError, bad_request, internal, shutting_down
from .events import Delta, Failed, Finished, Job, Started
from .outbox import Outbox
from .profile import WorkerClock
from .prompts import prompt_ids
from .schemas import SpeculationChoice

log = logging.getLogger("specdec.server")


@dataclass
class _Live:
    job: Job
    state: Request
    drafter: str


class EngineWorker:
    """Owns a BatchEngine and runs its steps while there is work, reading each request's text from the one stream
    core (engine.TextSteps) and converting it to events; idle, it sleeps on the inbox."""

    def __init__(
        self,
        decoder,
        max_batch: int,
        metrics=None,
        max_prefill_tokens: int = 512,
        drafter_options: dict | None = None,
        prefill_chunk: int | str | None = "auto",
    ):
        """drafter_options: create_drafter's options (n-gram sizes, the suffix index file) for drafters that
        requests pick by name; prefill_chunk: the prompt tokens a step prefills while others run (prefill.py)."""
        self.decoder = decoder
        self.tokenizer = decoder.target.tokenizer
        self.steps = TextSteps(decoder.batch_engine(max_batch, prefill_chunk=prefill_chunk))
        self.engine = self.steps.engine
        self.default_drafter = decoder.drafter.name if decoder.drafter is not None else "none"
        self.drafter_options = dict(drafter_options or {})
        self.metrics = metrics
        self.max_prefill_tokens = max_prefill_tokens
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.pending: deque[Job] = deque()
        self.live: dict[object, _Live] = {}  # by request id (TextUpdate.request_id)
        self.queued = self.running = 0  # for /health, written by the worker thread only
        self.clock = WorkerClock(self.engine)  # where the engine thread's time goes (profile.py)
        self.thread_ident: int | None = None  # the thread running the step loop, once it runs
        self.accepting = True
        self.thread = threading.Thread(target=self._loop, name="specdec-engine", daemon=True)
        self.runs_in_caller = False  # set by whoever will call run() instead of start()
        self.keep_running: Callable[[], bool] = lambda: True  # checked while idle
        self.stopped = threading.Event()
        self.outbox = Outbox()  # the events of each step go to the asyncio side together

    @property
    def prefix_cache_entries(self) -> int:
        """The most finished requests the prefix cache keeps (0: off)."""
        cache = self.decoder.target.backend.prefix_cache
        return cache.max_entries if cache is not None else 0

    @property
    def alive(self) -> bool:
        return not self.stopped.is_set() and (self.runs_in_caller or self.thread.is_alive())

    def run(self, keep_running: Callable[[], bool] = lambda: True) -> None:
        """Runs the step loop in the calling thread until stop(), or until keep_running() turns false while
        idle. Meant for the process's main thread: libgomp starts the OpenMP parallel regions of a non-initial
        thread about 40 us slower (its team sleeps between regions), which adds ~5 ms to each 10 ms step."""
        self.runs_in_caller = True
        self.keep_running = keep_running
        self._loop()

    # ---- called from other threads --------------------------------------------------------------
    def start(self) -> None:
        """Runs the step loop in a thread of its own, unless run() runs it elsewhere."""
        if not self.runs_in_caller:
            self.thread.start()

    def submit(self, job: Job) -> None:
        if not self.accepting:
            raise shutting_down()
        self.inbox.put(("submit", job))

    def cancel(self, request_id: str) -> None:
        self.inbox.put(("cancel", request_id))

    def cancel_all(self, error: APIError) -> None:
        """Ends every pending and running request with `error` after the current step (a drain's deadline)."""
        self.inbox.put(("fail", error))

    def stop(self, timeout: float = 60.0) -> None:
        """Fails whatever is still pending or running (503) and ends the thread."""
        self.accepting = False
        self.inbox.put(("stop", None))
        if self.runs_in_caller or self.thread.is_alive():
            self.stopped.wait(timeout)

    # ---- the worker thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            self._steps()
        finally:
            self.stopped.set()

    def _steps(self) -> None:
        self.thread_ident = threading.get_ident()
        while self._drain(block=not (self.pending or len(self.engine))):
            try:
                t = time.perf_counter()
                self._admit()
                self.clock.add("admission", t)
                if len(self.engine):
                    self._step()
            except Exception:  # a bug or a broken backend: fail the batch, keep serving
                log.exception("the engine step failed; failing the requests in the batch")
                self._fail_live(internal())
            self._publish()
        self._fail_all(shutting_down())
        self._publish()

    def _drain(self, block: bool) -> bool:
        """Applies every command in the inbox (waiting for one when idle); False once told to stop."""
        try:
            command = self._wait() if block else self.inbox.get_nowait()
            if command is None:
                return False
            while True:
                kind, arg = command
                if kind == "stop":
                    return False
                if kind == "submit":
                    self.pending.append(arg)
                elif kind == "fail":
                    self._fail_all(arg)
                else:
                    self._cancel(arg)
                command = self.inbox.get_nowait()
        except queue.Empty:
            return True

    def _wait(self):
        """The next command, or None once keep_running() is false. Wakes 4 times a second, so that a main
        thread waiting here still runs its signal handlers."""
        t = time.perf_counter()
        self.clock.idle_from(t)
        try:
            while self.keep_running():
                try:
                    return self.inbox.get(timeout=0.25)
                except queue.Empty:
                    continue
            return None
        finally:
            self.clock.add("idle", t)

    def _cancel(self, request_id: str) -> None:
        for job in self.pending:
            if job.request_id == request_id:
                self.pending.remove(job)
                return
        live = self.live.pop(request_id, None)
        if live is not None:
            self.steps.cancel(request_id)  # frees the KV slot now
            self._observe(live.state)

    def _admit(self) -> None:
        budget = self.max_prefill_tokens
        while self.pending and self.engine.free_slots > 0 and budget > 0:
            job = self.pending.popleft()
            try:
                budget -= self._start(job)
            except APIError as exc:
                job.emit(Failed(exc))
            except ContextLengthError as exc:
                param = "messages" if job.request.endpoint == "chat" else "prompt"
                job.emit(Failed(bad_request(str(exc), param, "context_length_exceeded")))
            except SpecdecError as exc:
                job.emit(Failed(bad_request(str(exc))))
            except Exception:
                log.exception("could not start request %s", job.request_id)
                job.emit(Failed(internal()))

    def _start(self, job: Job) -> int:
        """Adds the job to the engine; returns the prompt tokens it will prefill (those the prefix cache lacks)."""
        request = job.request
        ids = prompt_ids(self.decoder, request)
        drafter, name = self._drafter(request.speculation)
        speculation = self.engine.speculation
        if request.speculation.num_speculative_tokens is not None:
            speculation = speculation.with_k(request.speculation.num_speculative_tokens)
        if request.speculation.sampling_verifier is not None:
            speculation = replace(speculation, sampling_verifier=request.speculation.sampling_verifier)
        if request.speculation.adaptive is not None:
            speculation = replace(speculation, adaptive=request.speculation.adaptive)
        if request.speculation.acceptance is not None:  # a lossy one labels the response (usage.speculation)
            speculation = replace(speculation, acceptance=Acceptance.parse(request.speculation.acceptance))
        config = request.config
        if not request.max_tokens_given:  # a default length: clip it to the context left
            k = 0 if drafter.plain else speculation.num_speculative_tokens
            room = self.decoder.target.info.max_context - len(ids) - k - 1
            config = replace(config, max_new_tokens=max(1, min(config.max_new_tokens, room)))
        state = self.steps.submit(job.request_id, ids, config, drafter, speculation)
        self.live[job.request_id] = _Live(job, state, name)
        job.emit(Started(len(ids)))
        return len(ids) - (state.cache.length if state.cache is not None else 0)

    def _drafter(self, choice: SpeculationChoice) -> tuple[DrafterChoice, str]:
        """(the DrafterChoice BatchEngine.submit takes; its name, "none" when nothing drafts)."""
        if choice.drafter == "none" or choice.num_speculative_tokens == 0:
            return PLAIN, "none"
        if choice.drafter == self.default_drafter:
            return OWN_DRAFTER, choice.drafter
        # built on first use only (a drafter may load weights), then forked per request
        return DrafterChoice(self.decoder.drafter_named(choice.drafter, **self.drafter_options).fork()), choice.drafter

    def _step(self) -> None:
        if self.metrics is not None:
            self.metrics.step_batch.observe(len(self.engine))
        t0 = time.perf_counter()
        updates = self.steps.step()
        t1 = time.perf_counter()
        self.clock.stepped(t0, t1)
        with self.outbox.holding():
            for update in updates:
                self._deliver(update)
        self.clock.add("events", t1)

    def _deliver(self, update: TextUpdate) -> None:
        """Converts the stream core's update for one request into its events."""
        live = self.live.get(update.request_id)
        if live is None:
            return
        if update.error:  # its own step failed (its constraint cannot go on): it alone ends, with a 400
            del self.live[update.request_id]
            self._observe(update.state)
            live.job.emit(Failed(bad_request(update.error, code="constraint_unsatisfiable")))
            return
        if update.text or update.new_tokens:
            live.job.emit(Delta(update.text, update.new_tokens, update.logprobs, update.prompt_logprobs))
        if update.finished:
            state = update.state
            del self.live[update.request_id]
            self._observe(state)
            live.job.emit(
                Finished(
                    state.finished, state.prompt_len, len(state.generated), state.metrics, live.drafter, state.k_max
                )
            )

    def _fail_all(self, error: APIError) -> None:
        self._fail_live(error)
        for job in self.pending:
            job.emit(Failed(error))
        self.pending.clear()

    def _fail_live(self, error: APIError) -> None:
        """Ends every request holding a batch slot with `error`."""
        for request_id, live in list(self.live.items()):
            del self.live[request_id]
            try:
                self.steps.cancel(request_id)
            except Exception:
                log.exception("could not cancel request %s", request_id)
            live.job.emit(Failed(error))

    def _observe(self, state: Request) -> None:
        if self.metrics is not None:
            self.metrics.observe_generation(state.metrics)

    def _publish(self) -> None:
        self.queued, self.running = len(self.pending), len(self.engine)
        if self.metrics is not None:
            self.metrics.set_load(self.queued, self.running)
