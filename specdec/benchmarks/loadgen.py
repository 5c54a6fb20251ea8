"""The serving benchmark's client: streamed chat requests at a fixed concurrency, measured one by one.

Each run sends every prompt once, `concurrency` requests in flight at a time, and records for each
request time to first token (first content chunk), the gaps between its later content chunks (inter-token latency,
a chunk carrying the tokens one step emitted), latency (to `[DONE]`), completion tokens and the speculation
statistics the server reports in usage. A request that gets an error status, an error event or an exception is
*failed*; one whose stream ends without `[DONE]` and usage is *lost*. A run's goodput is the requests a second
that met the latency targets given (time to first token, time per output token after it), as vLLM's benchmark
counts it.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass, field

from .serve_profile import pooled_pass_share

MODES = {"off": {"enabled": False}, "on": None}  # speculation per request: drafting off, the server's default
LONG_MAX_TOKENS = 8  # a long prompt's answer: it is there for its prefill
LONG_PROMPT_DELAY_S = 1.0  # the first long prompt follows the run's start by this much


@dataclass
class RequestResult:
    status: str  # "ok", "failed" or "lost"
    latency_s: float
    ttft_s: float | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    step_tokens: float = 0.0  # MAT x verify steps
    drafting_steps: int = 0  # verify steps that scored drafts
    error: str = ""
    chunk_gaps_s: list[float] = field(default_factory=list)  # between consecutive content chunks after the first

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: (latency - TTFT) / (completion tokens - 1)."""
        if self.ttft_s is None or self.completion_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.completion_tokens - 1)

    def meets(self, ttft_s: float | None, tpot_s: float | None) -> bool:
        """Whether the request met the latency targets given (None: no target)."""
        if self.status != "ok":
            return False
        if ttft_s is not None and (self.ttft_s is None or self.ttft_s > ttft_s):
            return False
        return tpot_s is None or (self.tpot_s or 0.0) <= tpot_s


async def stream_events(response):
    """The JSON events of an OpenAI-style server-sent stream in order, then None once `data: [DONE]` arrives (a
    stream cut short ends without it)."""
    async for line in response.aiter_lines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            yield None
            return
        yield json.loads(line[6:])


async def one_request(client, url: str, body: dict) -> RequestResult:
    t0 = time.perf_counter()
    ttft, usage, done, last, gaps = None, None, False, None, []
    try:
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return RequestResult("failed", time.perf_counter() - t0, error=f"HTTP {r.status_code}: {text[:200]}")
            async for obj in stream_events(r):
                if obj is None:
                    done = True
                    break
                if "error" in obj:
                    return RequestResult("failed", time.perf_counter() - t0, error=str(obj["error"])[:200])
                usage = obj.get("usage") or usage
                if any(c.get("delta", {}).get("content") for c in obj.get("choices", [])):
                    now = time.perf_counter()
                    if ttft is None:
                        ttft = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
    except Exception as exc:  # a dropped connection, a timeout: the request failed
        return RequestResult("failed", time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:200])
    latency = time.perf_counter() - t0
    if not done or usage is None:
        return RequestResult("lost", latency, ttft, error="the stream ended without [DONE] and usage")
    spec = usage.get("speculation") or {}
    steps = spec.get("verify_steps") or 0
    return RequestResult("ok", latency, ttft, usage["prompt_tokens"], usage["completion_tokens"],
                         spec.get("drafted_tokens", 0), spec.get("accepted_tokens", 0), steps,
                         (spec.get("mean_accepted_tokens") or 0.0) * steps, spec.get("drafting_steps") or 0,
                         chunk_gaps_s=gaps)


async def run_level(url: str, model: str, prompts: list[str], concurrency: int, speculation: dict | None,
                    max_tokens: int, temperature: float = 0.0, api_key: str | None = None,
                    timeout: float = 600.0, long_prompts: list[str] = ()) -> tuple[float, list[RequestResult]]:
    """Sends every prompt once with `concurrency` in flight; returns (wall seconds, results in prompt order).
    long_prompts (a mixed workload): sent one after another, LONG_MAX_TOKENS each, while the prompts run; their
    results follow the prompts' and the wall time is the prompts' alone."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[RequestResult | None] = [None] * (len(prompts) + len(long_prompts))
    todo = iter(range(len(prompts)))
    streams_done = asyncio.Event()

    def body(text: str, tokens: int) -> dict:
        out = {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": tokens,
               "temperature": temperature, "stream": True, "stream_options": {"include_usage": True}}
        return out if speculation is None else {**out, "speculation": speculation}

    async def client_loop(client):
        for i in todo:
            results[i] = await one_request(client, url, body(prompts[i], max_tokens))
        streams_done.set()  # the prompts are running out: no more long prompts

    async def long_loop(client):
        await asyncio.sleep(LONG_PROMPT_DELAY_S)  # the streams run first
        for j, text in enumerate(long_prompts):
            if streams_done.is_set():
                break
            results[len(prompts) + j] = await one_request(client, url, body(text, LONG_MAX_TOKENS))

    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout), limits=limits) as client:
        t0 = time.perf_counter()
        intruder = asyncio.ensure_future(long_loop(client)) if long_prompts else None
        await asyncio.gather(*(client_loop(client) for _ in range(concurrency)))
        wall = time.perf_counter() - t0
        if intruder is not None:
            await intruder
    return wall, [r or RequestResult("lost", 0.0, error="never sent") for r in results[:len(prompts)]] + [
        r for r in results[len(prompts):] if r is not None]


def long_prompt_texts(texts: list[str], count: int, tokens: int) -> list[str]:
    """`count` long prompts of about `tokens` tokens (4 characters a token), each a request to summarize a document
    made of the given texts one after another, from a different one on; each opens differently, so that no prefix
    cache serves one from another."""
    if not texts or count < 1:
        return []
    out = []
    for i in range(count):
        document, k = [], i
        while sum(map(len, document)) < 4 * tokens:
            document.append(texts[k % len(texts)])
            k += 1
        out.append(f"Document {i + 1}. Summarize it in one sentence.\n\n" + "\n\n".join(document)[:4 * tokens])
    return out


def summarize(concurrency: int, mode: str, wall: float, results: list[RequestResult],
              slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    """One run's figures: aggregate tokens/s, TTFT, inter-token latency (every gap between content chunks of
    every request, pooled), time per output token and latency distributions, goodput under the latency targets
    given (requests a second that met them; None without a target), speculation, failures."""
    ok = [r for r in results if r.status == "ok"]
    good = (sum(r.meets(slo_ttft_s, slo_tpot_s) for r in results)
            if slo_ttft_s is not None or slo_tpot_s is not None else None)
    tokens = sum(r.completion_tokens for r in ok)
    drafted, accepted = sum(r.drafted_tokens for r in ok), sum(r.accepted_tokens for r in ok)
    steps, drafting_steps = sum(r.verify_steps for r in ok), sum(r.drafting_steps for r in ok)
    return {"concurrency": concurrency, "speculation": mode, "requests": len(results), "ok": len(ok),
            "failed": sum(r.status == "failed" for r in results), "lost": sum(r.status == "lost" for r in results),
            "wall_s": wall, "prompt_tokens": sum(r.prompt_tokens for r in ok), "completion_tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_s": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
            "itl_s": _dist([gap for r in ok for gap in r.chunk_gaps_s]),
            "tpot_s": _dist([r.tpot_s for r in ok if r.tpot_s is not None]),
            "latency_s": _dist([r.latency_s for r in ok]),
            "goodput": {"slo_ttft_s": slo_ttft_s, "slo_tpot_s": slo_tpot_s, "requests_met": good,
                        "requests_per_s": good / wall if good is not None and wall > 0 else None},
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_tokens": sum(r.step_tokens for r in ok) / steps if steps else None,
            "mean_acceptance_length": 1.0 + accepted / drafting_steps if drafting_steps else None,
            "drafted_tokens": drafted, "accepted_tokens": accepted,
            "errors": sorted({r.error for r in results if r.error})[:5],
            "per_request": [asdict(r) for r in results]}


def summarize_long(results: list[RequestResult]) -> dict:
    """The long prompts of a mixed run: how many were sent and answered, their prompt tokens and TTFT."""
    ok = [r for r in results if r.status == "ok"]
    return {"sent": len(results), "ok": len(ok), "failed": sum(r.status == "failed" for r in results),
            "lost": sum(r.status == "lost" for r in results),
            "prompt_tokens": _dist([float(r.prompt_tokens) for r in ok]),
            "ttft_s": _dist([r.ttft_s for r in ok if r.ttft_s is not None])}


def floors(runs: list[dict]) -> dict:
    """The serving floors, measured: throughput scaling without speculation, failures, latency gain at c=1, and
    speculation on over off at each concurrency. Repeated runs of one (concurrency, speculation) are pooled: their
    tokens over their seconds, their latencies weighted by requests."""
    def pooled(c, mode):
        same = _runs(runs, c, mode, long_prompts=False)
        wall = sum(r["wall_s"] for r in same)
        if not same or wall <= 0:
            return None
        timed = [r for r in same if r["latency_s"]["mean"]]
        latency = (sum(r["latency_s"]["mean"] * r["ok"] for r in timed) / max(1, sum(r["ok"] for r in timed))
                   if timed else None)
        return {"tokens_per_s": sum(r["completion_tokens"] for r in same) / wall, "latency_s": latency}

    levels = sorted({r["concurrency"] for r in runs})
    lo, hi = levels[0], levels[-1]
    out = {"lost_or_failed": sum(r["failed"] + r["lost"] + (r.get("long_prompts") or {}).get("failed", 0)
                                 + (r.get("long_prompts") or {}).get("lost", 0) for r in runs)}
    if (a := pooled(lo, "off")) and (b := pooled(hi, "off")) and a["tokens_per_s"] > 0:
        out[f"throughput_scaling_c{hi}_over_c{lo}_no_speculation"] = b["tokens_per_s"] / a["tokens_per_s"]
    if (a := pooled(lo, "off")) and (b := pooled(lo, "on")) and a["latency_s"] and b["latency_s"]:
        out[f"latency_speedup_c{lo}_speculation"] = a["latency_s"] / b["latency_s"]
    for c in levels:
        if (a := pooled(c, "off")) and (b := pooled(c, "on")) and a["tokens_per_s"] > 0:
            out[f"speculation_on_over_off_c{c}"] = b["tokens_per_s"] / a["tokens_per_s"]
    for c in levels:
        for mode in MODES:
            mixed = _gaps(_runs(runs, c, mode, long_prompts=True))
            plain = _gaps(_runs(runs, c, mode, long_prompts=False))
            if mixed and plain and plain["p50"]:
                out[f"itl_p99_with_long_prompts_over_p50_without_c{c}_{mode}"] = mixed["p99"] / plain["p50"]
            share = pooled_pass_share(_runs(runs, c, mode, long_prompts=False))
            if share is not None:
                out[f"engine_pass_share_c{c}_{mode}"] = share
    return out


def _runs(runs: list[dict], concurrency: int, mode: str, long_prompts: bool) -> list[dict]:
    """The runs at one concurrency and speculation mode, with long prompts arriving or without them."""
    return [r for r in runs if r["concurrency"] == concurrency and r["speculation"] == mode
            and bool(r.get("long_prompts")) == long_prompts]


def _gaps(runs: list[dict]) -> dict | None:
    """The inter-token latency distribution of the runs' requests, pooled (None: no gap)."""
    gaps = [g for r in runs for request in r.get("per_request", []) for g in request.get("chunk_gaps_s", [])]
    return _dist(gaps) if gaps else None


def _dist(xs: list[float]) -> dict:
    """mean, p50, p90, p99 (nearest rank) and max of the values; None each where there are none."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    xs = sorted(xs)

    def rank(q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"mean": statistics.fmean(xs), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": xs[-1]}
