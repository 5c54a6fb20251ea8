"""Runs the app under uvicorn until SIGTERM or SIGINT, then drains (`drain`): the server keeps listening while
the requests already admitted finish (up to `shutdown_timeout` seconds, then they are ended with a 503), new
generation requests get a 503 and /health says "draining" (a load balancer sees it instead of a refused
connection); then uvicorn closes the connections, the worker stops and the process exits 0. A second signal
exits at once.

The engine's step loop runs in the main thread and uvicorn's event loop in a second one: OpenMP
parallel regions start fastest from the process's initial thread (see EngineWorker.run).
"""

from __future__ import annotations

import asyncio
import signal
import threading
from typing import Callable

from ..errors import SpecdecError
from .errors import shutting_down

GRACE_S = 10  # after the deadline: for the current engine step to end and the ended requests to answer


async def drain(state, timeout: float, forced: Callable[[], bool], poll_s: float = 0.05) -> None:
    """Waits until no request is in flight, for `timeout` seconds at most; then ends what is left (pending or
    running) with a 503, streams with an error event and [DONE], and waits GRACE_S more for them to answer."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while state.inflight and not forced() and loop.time() < deadline:
        await asyncio.sleep(poll_s)
    if not state.inflight or forced():
        return
    state.worker.cancel_all(shutting_down())
    deadline = loop.time() + GRACE_S
    while state.inflight and not forced() and loop.time() < deadline:
        await asyncio.sleep(poll_s)


def serve(
    app, host: str, port: int, shutdown_timeout: float = 30.0, log_level: str = "info", access_log: bool = False
) -> None:
    import uvicorn

    state = app.state.server

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.draining = True  # /health says so; new generation requests get 503
            super().handle_exit(sig, frame)  # a second signal sets force_exit

        async def shutdown(self, sockets=None):
            await drain(state, shutdown_timeout, lambda: self.force_exit)
            await super().shutdown(sockets)  # closes the listener and the connections, then the lifespan

    # uvicorn's own deadline (after which it cancels the request tasks, answering nothing) only backs drain's up
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        lifespan="on",
        timeout_graceful_shutdown=GRACE_S,
    )
    server = Server(config)
    http = threading.Thread(target=server.run, name="specdec-http", daemon=True)
    state.worker.runs_in_caller = True  # the lifespan's worker.start() leaves the loop to us
    previous = {sig: signal.signal(sig, server.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        http.start()
        state.worker.run(keep_running=http.is_alive)
        http.join()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if not server.started:
        raise SpecdecError(f"the server could not start on {host}:{port} (see the log above)")
