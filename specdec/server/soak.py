"""The soak: a server under a mixed load for minutes, with clients that drop their streams.

`concurrency` client loops send requests back to back for the run's length, each drawn from a mix (KINDS):
streamed or not, greedy or sampled, structured output and tool calls, stop strings, prompts near the context limit,
identical prompts sent together (a few shared prompts, drawn by many loops at once, some dropped), streams the
client drops after a few chunks, and one request in ten asking for a single token. Every request is classed:
- ok: a 2xx answer, complete (a stream ends with [DONE]);
- dropped: the client closed the stream on purpose (expected, not a failure);
- failed: a 4xx or 5xx status or an error event (the 5xx are counted apart);
- lost: no complete answer (a connection error, a timeout, a stream cut short by the server).
The server's resident memory (`process_resident_memory_bytes` from /metrics) is sampled as it runs. A window per
minute gives ok, failed, lost and 5xx counts, p50/p99 time to first token and latency, and memory.
"""
from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass

from .loadgen import stream_events

KINDS = ("stream", "plain", "sampled", "json", "tool", "stop", "long", "same", "drop")
WORDS = ("the cat sat on the mat and looked at the sun while a big red dog ran to the house " * 4).split()
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
          "required": ["answer", "score"]}
TOOL = {"type": "function", "function": {"name": "lookup", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}


@dataclass
class SoakResult:
    kind: str
    status: str  # ok, dropped, failed or lost
    started_s: float  # since the soak began
    latency_s: float
    ttft_s: float | None = None
    http_status: int | None = None
    error: str = ""


def request_body(kind: str, model: str, prompts: list[str], rng: random.Random, max_tokens: int,
                 long_words: int) -> tuple[dict, bool]:
    """(the chat request body for one request of `kind`, whether it streams)."""
    prompt = rng.choice(prompts)
    length = 1 if rng.random() < 0.1 else max_tokens  # one-token requests end in their prefill step
    body = {"model": model, "max_tokens": length, "temperature": 0.0,
            "messages": [{"role": "user", "content": prompt}]}
    stream = kind in ("stream", "sampled", "stop", "drop", "same") or rng.random() < 0.5
    if kind == "sampled":
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(2 ** 31))
    elif kind == "json":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}
    elif kind == "tool":
        body.update(tools=[TOOL], tool_choice="required")
    elif kind == "stop":
        body["stop"] = [rng.choice(WORDS), "\n\n"]
    elif kind == "long":  # near the context limit: the server must fit it or refuse it cleanly (4xx)
        body["messages"][0]["content"] = " ".join(rng.choice(WORDS) for _ in range(long_words))
    elif kind == "same":
        body["messages"][0]["content"] = prompts[rng.randrange(min(3, len(prompts)))]
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return body, stream


async def one_request(client, url: str, kind: str, body: dict, stream: bool, t_start: float,
                      drop_after: int | None) -> SoakResult:
    t0 = time.perf_counter()
    started = t0 - t_start
    try:
        if not stream:
            r = await client.post(f"{url}/v1/chat/completions", json=body)
            status = "ok" if r.status_code == 200 and "choices" in r.json() else "failed"
            return SoakResult(kind, status, started, time.perf_counter() - t0, http_status=r.status_code,
                              error="" if status == "ok" else r.text[:200])
        ttft, chunks, done = None, 0, False
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return SoakResult(kind, "failed", started, time.perf_counter() - t0, http_status=r.status_code,
                                  error=text[:200])
            async for event in stream_events(r):
                if event is None:
                    done = True
                    break
                if "error" in event:
                    return SoakResult(kind, "failed", started, time.perf_counter() - t0, ttft, 200,
                                      str(event["error"])[:200])
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if drop_after is not None and chunks >= drop_after:
                    return SoakResult(kind, "dropped", started, time.perf_counter() - t0, ttft, 200)
        return SoakResult(kind, "ok" if done else "lost", started, time.perf_counter() - t0, ttft, 200,
                          "" if done else "the stream ended without [DONE]")
    except Exception as exc:  # a refused or broken connection, a timeout
        return SoakResult(kind, "lost", started, time.perf_counter() - t0, error=f"{type(exc).__name__}: {exc}"[:200])


async def soak(url: str, model: str, prompts: list[str], minutes: float, concurrency: int, max_tokens: int = 32,
               long_words: int = 400, api_key: str | None = None, timeout: float = 300.0, seed: int = 0,
               sample_every_s: float = 5.0) -> tuple[list[SoakResult], list[dict]]:
    """Runs the soak; returns (every request's result, memory samples {"t_s", "rss_bytes"})."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[SoakResult] = []
    memory: list[dict] = []
    t_start = time.perf_counter()
    end = t_start + minutes * 60

    async def client_loop(client, index: int):
        rng = random.Random(seed * 1000 + index)
        while time.perf_counter() < end:
            kind = rng.choice(KINDS)
            body, stream = request_body(kind, model, prompts, rng, max_tokens, long_words)
            dropping = kind == "drop" or (kind == "same" and rng.random() < 0.3)
            drop_after = rng.randint(1, 3) if dropping else None
            results.append(await one_request(client, url, kind, body, stream, t_start, drop_after))

    async def sampler(client):
        while time.perf_counter() < end:
            rss = await resident_memory(client, url)
            memory.append({"t_s": round(time.perf_counter() - t_start, 1), "rss_bytes": rss})
            await asyncio.sleep(sample_every_s)

    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout), limits=limits) as client:
        await asyncio.gather(sampler(client), *(client_loop(client, i) for i in range(concurrency)))
        memory.append({"t_s": round(time.perf_counter() - t_start, 1), "rss_bytes": await resident_memory(client, url)})
    return results, memory


async def resident_memory(client, url: str) -> int | None:
    """The server's resident memory in bytes, from its /metrics (prometheus_client's process collector)."""
    try:
        text = (await client.get(f"{url}/metrics")).text
    except Exception:
        return None
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return int(float(line.split()[1]))
    return None


def summarize(results: list[SoakResult], memory: list[dict], minutes: float, warmup_s: float = 60.0) -> dict:
    """Totals, per-minute windows and the soak's floors (0 lost, 0 5xx, memory growth after warm-up < 10%)."""
    windows = []
    for start in range(0, max(1, int(minutes * 60 + 0.999)), 60):
        rows = [r for r in results if start <= r.started_s < start + 60]
        rss = [m["rss_bytes"] for m in memory if start <= m["t_s"] < start + 60 and m["rss_bytes"]]
        windows.append({"start_s": start, **_counts(rows), "ttft_s": _percentiles([r.ttft_s for r in rows
                                                                                   if r.ttft_s is not None]),
                        "latency_s": _percentiles([r.latency_s for r in rows if r.status == "ok"]),
                        "rss_mb": round(max(rss) / 2 ** 20, 1) if rss else None})
    after = [m["rss_bytes"] for m in memory if m["t_s"] >= warmup_s and m["rss_bytes"]]
    growth = (after[-1] - after[0]) / after[0] if len(after) >= 2 else None
    totals = _counts(results)
    return {"minutes": minutes, "totals": totals,
            "by_kind": {k: _counts([r for r in results if r.kind == k]) for k in KINDS},
            "ttft_s": _percentiles([r.ttft_s for r in results if r.ttft_s is not None]),
            "latency_s": _percentiles([r.latency_s for r in results if r.status == "ok"]),
            "rss_growth_after_warmup": growth, "windows": windows, "memory": memory,
            "errors": sorted({r.error for r in results if r.error and r.status != "ok"})[:10],
            "floors": {"lost": totals["lost"], "http_5xx": totals["http_5xx"],
                       "rss_growth_under_10pct": growth is not None and growth < 0.10},
            "requests": [asdict(r) for r in results]}


def _counts(rows: list[SoakResult]) -> dict:
    out = {s: sum(r.status == s for r in rows) for s in ("ok", "dropped", "failed", "lost")}
    out["http_5xx"] = sum((r.http_status or 0) >= 500 for r in rows)
    out["http_4xx"] = sum(400 <= (r.http_status or 0) < 500 for r in rows)
    return {"requests": len(rows), **out}


def _percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None}
    xs = sorted(xs)
    return {"p50": round(xs[len(xs) // 2], 4), "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 4)}


def plot(summary: dict, path) -> bool:
    """Memory and p50/p99 latency per minute, as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    memory = [m for m in summary["memory"] if m["rss_bytes"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([m["t_s"] / 60 for m in memory], [m["rss_bytes"] / 2 ** 20 for m in memory], color="k")
    left.set(xlabel="minutes", ylabel="server resident memory (MiB)", ylim=(0, None))
    windows = [w for w in summary["windows"] if w["latency_s"]["p50"] is not None]
    for key in ("p50", "p99"):
        right.plot([w["start_s"] / 60 for w in windows], [w["latency_s"][key] for w in windows], marker="o", label=key)
    right.set(xlabel="minute", ylabel="latency of complete requests (s)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
    return True
