"""A `specdec serve` child process on a free local port: started, waited for (/health), stopped (SIGTERM). The
child ends with this process too, however it ends (parent_process.py).

Used by `specdec bench-serve` (when it starts its own server) and by the tests.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ..errors import SpecdecError
from ..parent_process import PARENT_PID_ENV


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`with ServerProcess(["--model", M]) as server: httpx.get(server.url + "/health")`."""

    def __init__(self, args: list[str], env: dict | None = None, port: int | None = None):
        self.args, self.port = list(args), port or free_port()
        self.env = {**os.environ, **(env or {})}
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile("w+", prefix="specdec-serve-", suffix=".log", delete=False)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 600.0) -> "ServerProcess":
        import httpx

        command = [sys.executable, "-m", "specdec.cli.main", "serve", *self.args, "--port", str(self.port)]
        env = {**self.env, PARENT_PID_ENV: str(os.getpid())}  # the process starting it, which it ends with
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SpecdecError(f"the server exited with status {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise SpecdecError(f"the server did not answer /health within {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> int | None:
        """SIGTERM, then SIGKILL after `timeout`; returns the exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log_tail(self, chars: int = 4000) -> str:
        self.log.flush()
        with open(self.log.name, encoding="utf-8", errors="replace") as f:
            return f.read()[-chars:]

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.log.close()
        os.unlink(self.log.name)
