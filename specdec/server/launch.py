"""Runs the app under uvicorn until SIGTERM or SIGINT, then drains: stop accepting, let in-flight
requests finish (up to `shutdown_timeout` seconds, then cancel them), stop the worker, return.

The engine's step loop runs in the main thread and uvicorn's event loop in a second one: OpenMP
parallel regions start fastest from the process's initial thread (see EngineWorker.run).
"""
from __future__ import annotations

import signal
import threading

from ..errors import SpecdecError


def serve(app, host: str, port: int, shutdown_timeout: float = 30.0, log_level: str = "info",
          access_log: bool = False) -> None:
    import uvicorn

    state = app.state.server

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            state.draining = True  # /health says so; new generation requests get 503
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=shutdown_timeout)
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
