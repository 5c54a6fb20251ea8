"""Graceful shutdown: on SIGTERM the server stops accepting, lets the in-flight stream finish, exits 0."""
import signal
import threading

import httpx
import pytest

pytest.importorskip("fastapi")

from specdec.server.process import ServerProcess  # noqa: E402


def test_sigterm_finishes_in_flight_work_and_exits_zero(tiny_folder):
    server = ServerProcess(["--model", str(tiny_folder), "--dtype", "float32", "--threads", "1",
                            "--served-model-name", "tiny"]).start()
    try:
        body = {"model": "tiny", "prompt": "the", "max_tokens": 400, "temperature": 0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}, "speculation": {"enabled": False}}
        lines, started = [], threading.Event()

        def read():
            with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)
                        started.set()

        reader = threading.Thread(target=read)
        reader.start()
        assert started.wait(30)
        server.proc.send_signal(signal.SIGTERM)
        at_signal = len(lines)
        assert server.proc.wait(60) == 0
        reader.join(10)
        assert lines[-1] == "data: [DONE]" and '"finish_reason":"length"' in lines[-3]
        assert '"completion_tokens":400' in lines[-2]  # the whole generation was sent
        assert at_signal < 300  # ... though SIGTERM came while it streamed
        with pytest.raises(httpx.ConnectError):  # no longer accepting
            httpx.get(server.url + "/health", timeout=5)
        assert "Traceback" not in server.log_tail()
    finally:
        server.stop()
