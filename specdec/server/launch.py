"""Runs the app under uvicorn until SIGTERM or SIGINT, then drains: stop accepting, let in-flight
requests finish (up to `shutdown_timeout` seconds, then cancel them), stop the worker, return."""
from __future__ import annotations

import signal


def serve(app, host: str, port: int, shutdown_timeout: float = 30.0, log_level: str = "info",
          access_log: bool = False) -> None:
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            app.state.server.draining = True  # /health says so; new generation requests get 503
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=access_log, lifespan="on",
                            timeout_graceful_shutdown=shutdown_timeout)
    # After shutting down, uvicorn restores the previous SIGTERM handler and raises the signal again;
    # a no-op handler there lets a terminated server exit with status 0.
    previous = signal.signal(signal.SIGTERM, lambda sig, frame: None)
    try:
        Server(config).run()
    finally:
        signal.signal(signal.SIGTERM, previous)
