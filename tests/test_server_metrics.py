"""What `specdec serve` reports and how it is measured: each request's own speculation statistics in its usage,
/v1/models, /health and the Prometheus metrics (per draft position too), and bench-serve against the running server
with its floors pooling repeated rounds."""
import json
import re

import httpx
import pytest

pytest.importorskip("openai")
pytest.importorskip("fastapi")

from served import AUTH, KEY, metric, prompt  # noqa: E402


def test_usage_reports_each_requests_own_speculation(openai_client):
    def run(speculation):
        stream = openai_client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "the dog ran to the dog ran to the"}], max_tokens=30,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"speculation": speculation, "ignore_eos": True})
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
        return chunks, chunks[-1].usage.model_extra["speculation"]

    chunks, off = run({"enabled": False})
    assert off["drafter"] == "none" and off["drafted_tokens"] == 0 and off["verify_steps"] == 29
    assert off["mean_accepted_tokens"] == 1.0 and off["acceptance_rate"] is None
    assert off["drafting_steps"] == 0 and off["mean_acceptance_length"] is None
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish[0].model_extra["speculation"] == off  # also on the chunk that carries finish_reason
    _, on = run({"drafter": "ngram", "num_speculative_tokens": 3})
    assert on["drafter"] == "ngram" and on["num_speculative_tokens"] == 3
    assert 0 <= on["accepted_tokens"] <= on["drafted_tokens"] <= 3 * on["drafting_steps"]
    assert on["drafting_steps"] <= on["verify_steps"]
    if on["drafting_steps"]:
        assert on["mean_acceptance_length"] == 1 + on["accepted_tokens"] / on["drafting_steps"]
    # drafting every step (adaptive off for these requests): whether it pays depends on this machine's speeds
    run({"drafter": "suffix", "adaptive": False})
    _, again = run({"drafter": "suffix", "adaptive": False})  # drafted from the first answer, held by the index
    assert again["drafter"] == "suffix" and again["accepted_tokens"] > 0
    # per step, ngram or suffix (no heads for this model) or none, by the speeds measured on this machine
    _, chosen = run({"drafter": "select"})
    steps = chosen.get("drafter_steps", {})
    assert chosen["drafter"] == "select" and set(steps) <= {"ngram", "suffix"}
    assert sum(steps.values()) <= chosen["verify_steps"] and chosen["accepted_tokens"] <= chosen["drafted_tokens"]
    assert "drafter_steps" not in again
    got = openai_client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0)
    assert set(got.usage.model_extra["speculation"]) >= {"drafted_tokens", "accepted_tokens", "acceptance_rate",
                                                         "mean_accepted_tokens"}


def test_models_health_and_metrics(openai_server, openai_client):
    assert [m.id for m in openai_client.models.list().data][0] == "tiny"
    for _ in range(2):  # the second is drafted from the first's answer (suffix index): the metrics have samples
        openai_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat sat"}],
                                              max_tokens=20, temperature=0,
                                              extra_body={"speculation": {"drafter": "suffix", "adaptive": False}})
    health = httpx.get(openai_server.url + "/health").json()  # no key needed
    assert health["status"] == "ok" and health["drafter"] == "quantized"  # auto: the 4-bit copy, where the kernels run
    text = httpx.get(openai_server.url + "/metrics", headers=AUTH).text
    for name in ("specdec_requests_total", "specdec_prompt_tokens_total", "specdec_generation_tokens_total",
                 "specdec_draft_tokens_total", "specdec_accepted_tokens_total", "specdec_acceptance_rate",
                 "specdec_mean_accepted_tokens", "specdec_drafting_steps_total",
                 "specdec_mean_acceptance_length", "specdec_time_to_first_token_seconds_bucket",
                 "specdec_request_latency_seconds_bucket", "specdec_queue_depth", "specdec_running_batch_size",
                 "process_resident_memory_bytes"):
        assert re.search(rf"^{name}[ {{]", text, re.M), name
    # per draft position (as vLLM exports them): the positions sum to the totals
    for kind in ("draft", "accepted"):
        per = re.findall(rf'^specdec_{kind}_tokens_per_position_total{{position="(\d+)"}} (\S+)$', text, re.M)
        assert per and {p for p, _ in per} >= {"0"}
        assert sum(float(v) for _, v in per) == metric(openai_server, f"specdec_{kind}_tokens_total") > 0


def test_bench_serve_against_the_running_server(openai_server, tmp_path, capsys):
    from specdec.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": f"c{i % 2}", "turns": [prompt(i)]}) + "\n"
                               for i in range(4)))
    out, report = tmp_path / "bench.json", tmp_path / "bench.md"
    rc = main(["bench-serve", "--url", openai_server.url, "--api-key", KEY, "--prompts", str(prompts),
               "--max-tokens", "8", "--concurrency", "1,4", "--rounds", "2", "--profile", "--out-json", str(out),
               "--report", str(report)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert summary["meta"]["date"].startswith("20") and "commit" in summary["meta"]
    assert [(r["concurrency"], r["round"], r["speculation"]) for r in summary["runs"]] == [
        (1, 1, "off"), (1, 1, "on"), (1, 2, "on"), (1, 2, "off"), (4, 1, "off"), (4, 1, "on"), (4, 2, "on"),
        (4, 2, "off")]
    assert all(r["ok"] == 4 and r["failed"] == r["lost"] == 0 and r["tokens_per_s"] > 0 for r in summary["runs"])
    assert summary["floors"]["lost_or_failed"] == 0 and "| concurrency |" in report.read_text()
    assert {"speculation_on_over_off_c1", "speculation_on_over_off_c4"} <= set(summary["floors"])
    # --profile: the engine thread's parts cover each run (idle counted as it goes) and its passes hold most of it
    for r in summary["runs"]:
        p = r["profile"]
        assert p["seconds"]["pass"] > 0 and p["seconds"]["prefill"] > 0 and p["busy_s"] > 0
        assert 0.8 < sum(p["share"].values()) < 1.1, p["share"]
        assert p["thread_cpu_s"]["engine"] > 0 and p["thread_cpu_s"]["http"] >= 0 and p["process_cpu_s"] >= 0
    # the process's CPU seconds count in ticks of 10 ms, which a run of a few milliseconds may not reach
    assert sum(r["profile"]["process_cpu_s"] for r in summary["runs"]) > 0
    assert 0 < summary["floors"]["engine_pass_share_c4_off"] <= 1
    assert "| in passes |" in report.read_text()


def test_serving_floors_pool_repeated_runs():
    """Rounds of one (concurrency, speculation) count as one run: their tokens over their seconds."""
    from specdec.benchmarks.load_summary import floors

    def run(c, mode, tokens, wall, latency):
        return {"concurrency": c, "speculation": mode, "completion_tokens": tokens, "wall_s": wall, "ok": 4,
                "failed": 0, "lost": 0, "latency_s": {"mean": latency}}

    runs = [run(1, "off", 100, 10.0, 2.0), run(1, "on", 100, 5.0, 1.0), run(1, "on", 100, 15.0, 3.0),
            run(1, "off", 100, 10.0, 2.0), run(4, "off", 400, 10.0, 2.0), run(4, "on", 400, 8.0, 1.5)]
    got = floors(runs)
    assert got["speculation_on_over_off_c1"] == 1.0  # 200 tokens in 20 s either way
    assert got["speculation_on_over_off_c4"] == 1.25
    assert got["latency_speedup_c1_speculation"] == 1.0
    assert got["throughput_scaling_c4_over_c1_no_speculation"] == 4.0 and got["lost_or_failed"] == 0
    alone = floors([r for r in runs if r["concurrency"] == 4])  # one concurrency: no scaling to report
    assert not any(name.startswith("throughput_scaling") for name in alone) and alone["lost_or_failed"] == 0
