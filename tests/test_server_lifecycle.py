"""Graceful shutdown: on SIGTERM the server stops accepting, lets the in-flight stream finish, exits 0."""
import signal
import threading

import httpx
import pytest

pytest.importorskip("fastapi")

from specdec.benchmarks.server_process import ServerProcess  # noqa: E402


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


def test_a_drain_answers_503_to_newcomers_and_ends_what_outlives_the_timeout(tiny_folder):
    """One batch slot, twenty 500-token streams (five to twelve seconds of work here), SIGTERM once the first
    streams, a two-second --shutdown-timeout: while draining the server still listens, /health answers 503
    "draining" and a new request a 503 OpenAI error; by the deadline the requests admitted have either finished or
    been ended with a 503 (an HTTP 503, or an error event and [DONE] in a stream already begun), none is cut off
    without an answer, and the process exits 0 soon after the deadline."""
    import asyncio
    import time

    from specdec.server.launch import GRACE_S

    timeout = 2.0
    server = ServerProcess(["--model", str(tiny_folder), "--dtype", "float32", "--threads", "1", "--served-model-name",
                            "tiny", "--max-batch", "1", "--max-queue", "24",
                            "--shutdown-timeout", str(timeout)]).start()
    body = {"model": "tiny", "prompt": "the", "max_tokens": 500, "temperature": 0, "ignore_eos": True, "stream": True,
            "speculation": {"enabled": False}}

    async def stream(client, first: asyncio.Event) -> str:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return "503" if r.status_code == 503 and r.json()["error"]["code"] == "server_shutting_down" else \
                    f"status {r.status_code}"
            lines = [line async for line in _lines(r, first)]
        if lines[-1:] != ["data: [DONE]"]:
            return "cut off"
        return "finished" if '"finish_reason":"length"' in lines[-2] else \
            "503" if "server_shutting_down" in lines[-2] else f"ended with {lines[-2][:80]}"

    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
            first = asyncio.Event()
            streams = [asyncio.create_task(stream(client, first))]
            await asyncio.wait_for(first.wait(), 30)
            streams += [asyncio.create_task(stream(client, first)) for _ in range(19)]
            # SIGTERM once the server holds every stream not yet ended (a busy machine may take a while to
            # connect them; a stream that connects only after the process is gone would find no listener)
            admitted = time.monotonic() + 60
            while time.monotonic() < admitted:
                held = (await client.get("/health")).json()
                if held["running"] + held["queued"] + sum(task.done() for task in streams) >= len(streams):
                    break
                await asyncio.sleep(0.05)
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            health = await client.get("/health")
            newcomer = await client.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2})
            outcomes = await asyncio.gather(*streams)
            return signalled, health, newcomer, outcomes

    try:
        signalled, health, newcomer, outcomes = asyncio.run(scenario())
        exit_status = server.proc.wait(60)
        exited_after = time.monotonic() - signalled
    finally:
        server.stop()
    assert health.status_code == 503 and health.json()["status"] == "draining"
    assert newcomer.status_code == 503 and newcomer.json()["error"]["code"] == "server_shutting_down"
    assert set(outcomes) <= {"finished", "503"}, outcomes
    assert outcomes[0] == "finished" and outcomes.count("503") >= 3, outcomes
    assert exit_status == 0 and exited_after < timeout + GRACE_S, exited_after
    assert "Traceback" not in server.log_tail()


async def _lines(response, first):
    async for line in response.aiter_lines():
        if line:
            first.set()
            yield line
