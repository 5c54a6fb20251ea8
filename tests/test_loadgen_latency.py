"""bench-serve's latency figures: inter-token latency from the gaps between a stream's content chunks, time per
output token, percentiles, and goodput under latency targets (requests that met them, a second)."""
import asyncio
import json

import httpx
import pytest

from specdec.benchmarks.load_summary import _dist, floors, summarize, summarize_long
from specdec.benchmarks.loadgen import LONG_MAX_TOKENS, RequestResult, long_prompt_texts, one_request, run_level
from specdec.benchmarks.serve_report import markdown


def _stream(contents: list[str]) -> bytes:
    """An OpenAI-style stream: a role-only chunk, one chunk per content, a usage chunk, [DONE]."""
    events = [{"choices": [{"delta": {"role": "assistant"}}]}]
    events += [{"choices": [{"delta": {"content": c}}]} for c in contents]
    events.append({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(contents)}})
    return ("".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n").encode()


def test_a_stream_gives_one_gap_per_content_chunk_after_the_first():
    body = _stream(["a", "b", "", "c", "d"])  # an empty content is no token

    async def go():
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as client:
            return await one_request(client, "http://x", {})

    result = asyncio.run(go())
    assert result.status == "ok" and result.ttft_s is not None and result.completion_tokens == 5
    assert len(result.chunk_gaps_s) == 3 and all(g >= 0 for g in result.chunk_gaps_s)


def test_percentiles_are_ordered_nearest_ranks():
    xs = [float(i) for i in range(1, 201)]
    d = _dist(xs[::-1])
    assert d["p50"] == 101.0 and d["p90"] == 181.0 and d["p99"] == 199.0 and d["max"] == 200.0
    assert d["mean"] == pytest.approx(100.5)
    assert _dist([]) == {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}


def _ok(ttft: float, latency: float, tokens: int, gaps: list[float]) -> RequestResult:
    return RequestResult("ok", latency, ttft, 10, tokens, chunk_gaps_s=gaps)


def test_goodput_counts_the_requests_that_met_every_target_given():
    results = [_ok(0.1, 1.1, 11, [0.1] * 10),  # TPOT 0.1
               _ok(0.5, 1.5, 11, [0.1] * 10),  # TTFT too slow
               _ok(0.1, 3.1, 11, [0.3] * 10),  # TPOT 0.3: too slow
               RequestResult("failed", 0.2, error="HTTP 500")]
    run = summarize(4, "on", 2.0, results, slo_ttft_s=0.2, slo_tpot_s=0.15)
    assert run["goodput"]["requests_met"] == 1 and run["goodput"]["requests_per_s"] == pytest.approx(0.5)
    assert summarize(4, "on", 2.0, results, slo_ttft_s=0.2)["goodput"]["requests_met"] == 2
    assert summarize(4, "on", 2.0, results)["goodput"]["requests_per_s"] is None
    # inter-token latency pools every gap of every request that ended well
    assert run["itl_s"]["p50"] == pytest.approx(0.1) and run["itl_s"]["max"] == pytest.approx(0.3)
    assert run["tpot_s"]["max"] == pytest.approx(0.3) and run["tpot_s"]["p50"] == pytest.approx(0.1)


def test_one_token_has_no_time_per_output_token():
    assert _ok(0.1, 0.1, 1, []).tpot_s is None and _ok(0.1, 0.3, 3, [0.1, 0.1]).tpot_s == pytest.approx(0.1)


@pytest.mark.parametrize("option", ["--slo-ttft", "--slo-tpot"])
def test_a_latency_target_that_is_not_positive_is_one_line(capsys, option):
    from cli_runner import run_cli

    rc, _, err = run_cli(capsys, "bench-serve", "--url", "http://127.0.0.1:9", option, "0")
    assert rc == 2 and "--slo-ttft and --slo-tpot take seconds above 0" in err and len(err.strip().splitlines()) == 1


def test_long_prompts_are_about_as_long_as_asked_and_open_differently():
    texts = ["alpha " * 50, "beta " * 80, "gamma " * 20]
    prompts = long_prompt_texts(texts, 3, 500)
    assert len(prompts) == 3 and all(1900 <= len(p) <= 2100 for p in prompts)
    assert len({p[:12] for p in prompts}) == 3  # no prefix cache serves one from another
    assert long_prompt_texts(texts, 0, 500) == [] and long_prompt_texts([], 2, 500) == []


def test_a_mixed_run_sends_its_long_prompts_while_the_streams_run_and_reports_them_apart():
    """The streams' results come first, in prompt order, and the wall time is theirs; the long prompts' follow."""
    seen = []

    async def answer(request):
        body = json.loads(request.content)
        seen.append(body["max_tokens"])
        await asyncio.sleep(0.2 if body["max_tokens"] == 4 else 0.01)  # the streams outlast the long prompts
        return httpx.Response(200, content=_stream(["x"] * body["max_tokens"]))

    async def go():
        real = httpx.AsyncClient

        def mocked(**kwargs):
            return real(transport=httpx.MockTransport(answer), **kwargs)

        import specdec.benchmarks.loadgen as loadgen

        old, loadgen.LONG_PROMPT_DELAY_S = loadgen.LONG_PROMPT_DELAY_S, 0.0
        httpx.AsyncClient = mocked
        try:
            return await run_level("http://x", "m", ["a", "b", "c"], 2, None, 4, long_prompts=["L1", "L2"])
        finally:
            httpx.AsyncClient, loadgen.LONG_PROMPT_DELAY_S = real, old

    wall, results = asyncio.run(go())
    streams, longs = results[:3], results[3:]
    assert all(r.status == "ok" and r.completion_tokens == 4 for r in streams)
    assert len(longs) == 2 and all(r.completion_tokens == LONG_MAX_TOKENS for r in longs)
    assert summarize_long(longs)["ok"] == 2 and sorted(seen) == [4, 4, 4, LONG_MAX_TOKENS, LONG_MAX_TOKENS]


def _run(c: int, mode: str, gaps: list[float], long: bool) -> dict:
    run = summarize(c, mode, 1.0, [_ok(0.1, 1.0, len(gaps) + 1, gaps)])
    return {**run, "long_prompts": summarize_long([_ok(2.0, 2.5, 8, [])])} if long else run


def test_the_mixed_floor_is_the_p99_with_long_prompts_over_the_median_without():
    runs = [_run(16, "off", [0.05] * 99, False), _run(16, "off", [0.05] * 90 + [0.12] * 10, True)]
    out = floors(runs)
    assert out["itl_p99_with_long_prompts_over_p50_without_c16_off"] == pytest.approx(0.12 / 0.05)
    assert "speculation_on_over_off_c16" not in out and out["lost_or_failed"] == 0
    report = markdown({"meta": {"model": "m", "prompts": 1, "prompt_file": "p", "max_tokens": 8, "temperature": 0},
                       "runs": runs, "floors": out})
    assert "| 2.40x | at most 3.00x | yes |" in report and "off, 1 long prompts" in report
