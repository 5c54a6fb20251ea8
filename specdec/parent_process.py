"""A child process that ends with the process that started it: `specdec serve` started by `bench-serve` or a test
(benchmarks/server_process.py) would otherwise outlive a parent killed with SIGKILL, or with SIGTERM before its
clean-up ran, and keep its memory, its port and, through OpenMP's threads, a share of the CPU that later benchmarks
would read as noise.

The parent names itself in the child's environment (PARENT_PID_ENV); the child polls its parent's id, which changes
when the parent dies and the child is handed to another (init or a subreaper), and then sends itself SIGTERM: the
server drains as on any SIGTERM (server/launch.py), and before the server's handlers are installed the signal ends
the process at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time

from .errors import ConfigError

PARENT_PID_ENV = "SPECDEC_PARENT_PID"
POLL_S = 0.5


def exit_with_parent(environ: dict | None = None, poll_s: float = POLL_S) -> threading.Thread | None:
    """Where PARENT_PID_ENV names a process id, starts a daemon thread that sends this process SIGTERM once its
    parent is no longer that process; returns the thread, or None where the variable is unset or empty."""
    value = (os.environ if environ is None else environ).get(PARENT_PID_ENV, "")
    if not value:
        return None
    if not value.isdigit():
        raise ConfigError(f"{PARENT_PID_ENV} must be a process id, got {value!r}")
    parent = int(value)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="specdec-parent-watch", daemon=True)
    thread.start()
    return thread
