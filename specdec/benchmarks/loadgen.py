"""The serving benchmark's client: streamed chat requests at a fixed concurrency, measured one by one.

Each run sends every prompt once, `concurrency` requests in flight at a time, and records for each
request time to first token (first content chunk), the gaps between its later content chunks (inter-token latency,
a chunk carrying the tokens one step emitted), latency (to `[DONE]`), completion tokens and the speculation
statistics the server reports in usage. A request that gets an error status, an error event or an exception is
*failed*; one whose stream ends without `[DONE]` and usage is *lost*. A run's goodput is the requests a second
that met the latency targets given (time to first token, time per output token after it), as vLLM's benchmark
counts it. A run's figures are load_summary.py's.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field


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
    ttft: float | None = None
    usage, done, last, gaps = None, False, t0, []  # last: when the previous content chunk came
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
    return RequestResult(
        "ok",
        latency,
        ttft,
        usage["prompt_tokens"],
        usage["completion_tokens"],
        spec.get("drafted_tokens", 0),
        spec.get("accepted_tokens", 0),
        steps,
        (spec.get("mean_accepted_tokens") or 0.0) * steps,
        spec.get("drafting_steps") or 0,
        chunk_gaps_s=gaps,
    )


async def run_level(
    url: str,
    model: str,
    prompts: list[str],
    concurrency: int,
    speculation: dict | None,
    max_tokens: int,
    temperature: float = 0.0,
    api_key: str | None = None,
    timeout: float = 600.0,
    long_prompts: list[str] | tuple[()] = (),
) -> tuple[float, list[RequestResult]]:
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
        out = {
            "model": model,
            "messages": [{"role": "user", "content": text}],
            "max_tokens": tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
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
    return wall, [r or RequestResult("lost", 0.0, error="never sent") for r in results[: len(prompts)]] + [
        r for r in results[len(prompts) :] if r is not None
    ]


def long_prompt_texts(texts: list[str], count: int, tokens: int) -> list[str]:
    """`count` long prompts of about `tokens` tokens (4 characters a token), each a request to summarize a document
    made of the given texts one after another, from a different one on; each opens differently, so that no prefix
    cache serves one from another."""
    if not texts or count < 1:
        return []
    out = []
    for i in range(count):
        document: list[str] = []
        k = i
        while sum(len(text) for text in document) < 4 * tokens:
            document.append(texts[k % len(texts)])
            k += 1
        out.append(f"Document {i + 1}. Summarize it in one sentence.\n\n" + "\n\n".join(document)[: 4 * tokens])
    return out
