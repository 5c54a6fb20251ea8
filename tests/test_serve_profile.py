"""Where the server's time goes: the engine thread's clock by part, what /metrics shows of it, and what
bench-serve --profile makes of two scrapes around a run."""
import time

import httpx
import pytest

pytest.importorskip("prometheus_client")

from specdec.benchmarks import serve_profile  # noqa: E402
from specdec.benchmarks.serve_profile import PARTS, between, markdown_rows, pooled_pass_share  # noqa: E402
from specdec.server.metrics import ServerMetrics  # noqa: E402
from specdec.server.profile import WORKER_PARTS, WorkerClock, thread_cpu_seconds  # noqa: E402


class _Engine:
    def __init__(self):
        self.seconds = {"prefill": 0.0, "draft": 0.0, "pass": 0.0, "verify": 0.0}


def test_a_step_is_split_into_the_engines_parts_and_text():
    engine = _Engine()
    clock = WorkerClock(engine)
    engine.seconds["pass"] += 0.30
    engine.seconds["verify"] += 0.05
    clock.stepped(10.0, 10.5)  # the stream core's step took 0.5 s: 0.35 of it the engine's parts
    assert clock.seconds["pass"] == pytest.approx(0.30) and clock.seconds["verify"] == pytest.approx(0.05)
    assert clock.seconds["text"] == pytest.approx(0.15)
    engine.seconds["pass"] += 0.10
    clock.stepped(11.0, 11.1)  # only what grew since the last step counts
    assert clock.seconds["pass"] == pytest.approx(0.40) and clock.seconds["text"] == pytest.approx(0.15)
    assert set(clock.seconds) == set(WORKER_PARTS) == set(PARTS)


def test_the_metrics_receive_what_grew_and_bench_serve_reads_it_back(monkeypatch):
    metrics = ServerMetrics()
    engine = _Engine()
    clock = WorkerClock(engine)
    metrics.watch_engine(clock.totals)

    def scrape():
        text = metrics.exposition({"engine": None, "http": __import__("threading").get_ident()})
        monkeypatch.setattr(httpx, "get", lambda *a, **k: httpx.Response(200, text=text.decode()))
        return serve_profile.scrape("http://x")

    before = scrape()
    clock.add("idle", time.perf_counter() - 0.2)
    engine.seconds["prefill"] += 0.1
    engine.seconds["pass"] += 0.5
    clock.stepped(0.0, 0.7)
    clock.add("events", time.perf_counter() - 0.05)
    sum(range(200_000))  # some CPU time on this thread
    after = scrape()
    run = between(before, after)
    assert run["seconds"]["pass"] == pytest.approx(0.5) and run["seconds"]["prefill"] == pytest.approx(0.1)
    assert run["seconds"]["text"] == pytest.approx(0.1) and run["seconds"]["idle"] == pytest.approx(0.2, abs=0.01)
    assert run["busy_s"] == pytest.approx(0.75, abs=0.01)
    assert run["pass_share_of_busy"] == pytest.approx(0.6 / run["busy_s"])
    assert run["thread_cpu_s"]["http"] > 0 and "engine" not in run["thread_cpu_s"]  # no engine thread: not shown
    assert run["process_cpu_s"] is not None


def test_pass_shares_pool_the_runs_seconds_and_the_report_shows_each_run():
    def profile(passes, busy):
        seconds = dict.fromkeys(PARTS, 0.0) | {"pass": passes, "draft": busy - passes}
        return {"interval_s": busy, "seconds": seconds, "share": {p: v / busy for p, v in seconds.items()},
                "busy_s": busy, "pass_share_of_busy": passes / busy, "thread_cpu_s": {"engine": busy},
                "process_cpu_s": 2 * busy}

    runs = [{"concurrency": 16, "speculation": "off", "round": 1, "profile": profile(9.0, 10.0)},
            {"concurrency": 16, "speculation": "off", "round": 2, "profile": profile(1.0, 10.0)}]
    assert pooled_pass_share(runs) == pytest.approx(0.5)
    assert pooled_pass_share([{"concurrency": 1}]) is None
    rows = markdown_rows(runs)
    assert "| 16 | 1 | off |" in rows[-2] and "90.0%" in rows[-2] and "1.00 / n/a / 2.00" in rows[-2]


def test_a_wait_in_progress_counts_as_idle_until_it_ends():
    clock = WorkerClock(_Engine())
    start = time.perf_counter() - 1.0
    clock.idle_from(start)
    assert clock.totals()["idle"] >= 1.0 and clock.seconds["idle"] == 0.0
    clock.add("idle", start)
    ended = clock.totals()["idle"]
    time.sleep(0.02)
    assert clock.totals()["idle"] == ended >= 1.0  # counted once, and no longer growing


def test_a_thread_that_is_not_there_has_no_cpu_seconds():
    assert thread_cpu_seconds(None) is None
    assert thread_cpu_seconds(__import__("threading").get_ident()) > 0
