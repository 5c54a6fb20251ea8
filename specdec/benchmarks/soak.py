"""The soak: a server under a mixed load for minutes, with clients that drop their streams.

`concurrency` client loops send requests back to back for the run's length, each drawn from a mix (KINDS):
streamed or not, greedy or sampled, structured output and tool calls, stop strings, prompts near the context limit,
identical prompts sent together (a few shared prompts, drawn by many loops at once, some dropped), streams the
client drops after a few chunks, and one request in ten asking for a single token. Every request ends as one of
STATUSES:
- ok: a 2xx answer, complete (a stream ends with [DONE]);
- dropped: the client closed the stream on purpose (expected, not a failure);
- failed: a final answer that is an error: a 4xx or 5xx status, or an error event (the 5xx are counted apart);
- lost: no final answer within the client timeout (`timeout`, from the request's first attempt, retries
  included), or none at all: a refused or broken connection, a stream cut short without [DONE].
A 429 is no final answer: the client waits its Retry-After and sends the request again (counted as `retries`;
one that still gets 429s at its timeout is lost). The server's resident memory (`process_resident_memory_bytes`
from /metrics) is sampled as it runs; soak_report.py summarizes.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any
from dataclasses import dataclass

from .loadgen import stream_events

STATUSES = ("ok", "dropped", "failed", "lost")
KINDS = ("stream", "plain", "sampled", "json", "tool", "stop", "long", "same", "drop")
WORDS = ("the cat sat on the mat and looked at the sun while a big red dog ran to the house " * 4).split()
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "score": {"type": "integer"}},
    "required": ["answer", "score"],
}
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


@dataclass
class SoakResult:
    kind: str
    status: str  # one of STATUSES
    started_s: float  # since the soak began
    latency_s: float  # from the first attempt
    ttft_s: float | None = None  # from the first attempt
    http_status: int | None = None  # of the final answer
    error: str = ""
    retries: int = 0  # 429s answered, each followed by its Retry-After wait and another attempt


def request_body(
    kind: str, model: str, prompts: list[str], rng: random.Random, max_tokens: int, long_words: int
) -> tuple[dict, bool]:
    """(the chat request body for one request of `kind`, whether it streams)."""
    prompt = rng.choice(prompts)
    length = 1 if rng.random() < 0.1 else max_tokens  # one-token requests end in their prefill step
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": length,
        "temperature": 0.0,
        "messages": [{"role": "user", "content": prompt}],
    }
    stream = kind in ("stream", "sampled", "stop", "drop", "same") or rng.random() < 0.5
    if kind == "sampled":
        body.update(temperature=0.8, top_p=0.95, seed=rng.randrange(2**31))
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


async def one_request(
    client, url: str, kind: str, body: dict, stream: bool, t_start: float, drop_after: int | None, timeout: float
) -> SoakResult:
    """Sends one request until it has a final answer (a 429 is retried after its Retry-After), or until `timeout`
    seconds have passed since the first attempt: then it is lost."""
    t0 = time.perf_counter()
    retries = 0

    async def attempts() -> SoakResult:
        nonlocal retries
        while True:
            outcome = await _attempt(client, url, kind, body, stream, t0, drop_after)
            if isinstance(outcome, SoakResult):
                return outcome
            retries += 1
            await asyncio.sleep(outcome)

    try:
        result = await asyncio.wait_for(attempts(), timeout)
    except asyncio.TimeoutError:
        result = SoakResult(kind, "lost", 0.0, 0.0, error=f"no final answer within the client timeout ({timeout:g} s)")
    result.started_s, result.latency_s, result.retries = t0 - t_start, time.perf_counter() - t0, retries
    return result


def retry_after_s(headers) -> float:
    """A 429's Retry-After in seconds (integer seconds, as the server sends it); 1 when absent or unreadable."""
    try:
        return min(60.0, max(0.0, float(headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


async def _attempt(
    client, url: str, kind: str, body: dict, stream: bool, t0: float, drop_after: int | None
) -> SoakResult | float:
    """The outcome of one attempt, or for a 429 the seconds to wait before the next one. Times are from t0, the
    request's first attempt."""

    def ended(status: str, http: int | None = None, ttft: float | None = None, error: str = "") -> SoakResult:
        return SoakResult(kind, status, 0.0, 0.0, ttft, http, error[:200])

    try:
        if not stream:
            r = await client.post(f"{url}/v1/chat/completions", json=body)
            if r.status_code == 429:
                return retry_after_s(r.headers)
            ok = r.status_code == 200 and "choices" in r.json()
            return ended("ok" if ok else "failed", r.status_code, error="" if ok else r.text)
        ttft, chunks = None, 0
        async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
            if r.status_code == 429:
                return retry_after_s(r.headers)
            if r.status_code != 200:
                return ended("failed", r.status_code, error=(await r.aread()).decode(errors="replace"))
            async for event in stream_events(r):
                if event is None:
                    return ended("ok", 200, ttft)
                if "error" in event:
                    return ended("failed", 200, ttft, str(event["error"]))
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if drop_after is not None and chunks >= drop_after:
                    return ended("dropped", 200, ttft)
        return ended("lost", 200, ttft, "the stream ended without [DONE]")
    except Exception as exc:  # a refused or broken connection, an httpx timeout
        return ended("lost", error=f"{type(exc).__name__}: {exc}")


async def soak(
    url: str,
    model: str,
    prompts: list[str],
    minutes: float,
    concurrency: int,
    max_tokens: int = 32,
    long_words: int = 400,
    api_key: str | None = None,
    timeout: float = 120.0,
    seed: int = 0,
    sample_every_s: float = 5.0,
    ramp_s: float | None = None,
) -> tuple[list[SoakResult], list[dict]]:
    """Runs the soak; returns (every request's result, memory samples {"t_s", "rss_bytes"}). timeout: the client's,
    per request (see `one_request`). ramp_s: the client loops start one after another over this many seconds
    (default: a tenth of the run, at most 30 s), as load generators ramp up, rather than all in the same
    instant: a first wave of `concurrency` prompts all prefilled at once would measure that instant, not the
    steady load."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    results: list[SoakResult] = []
    memory: list[dict] = []
    t_start = time.perf_counter()
    end = t_start + minutes * 60

    ramp_s = min(30.0, minutes * 6) if ramp_s is None else ramp_s

    async def client_loop(client, index: int):
        rng = random.Random(seed * 1000 + index)
        await asyncio.sleep(ramp_s * index / concurrency)
        while time.perf_counter() < end:
            kind = rng.choice(KINDS)
            body, stream = request_body(kind, model, prompts, rng, max_tokens, long_words)
            dropping = kind == "drop" or (kind == "same" and rng.random() < 0.3)
            drop_after = rng.randint(1, 3) if dropping else None
            results.append(await one_request(client, url, kind, body, stream, t_start, drop_after, timeout))

    async def sampler(client):
        while time.perf_counter() < end:
            rss = await resident_memory(client, url)
            memory.append({"t_s": round(time.perf_counter() - t_start, 1), "rss_bytes": rss})
            await asyncio.sleep(sample_every_s)

    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(timeout), limits=limits) as client:
        await asyncio.gather(sampler(client), *(client_loop(client, i) for i in range(concurrency)))
        memory.append({"t_s": round(time.perf_counter() - t_start, 1), "rss_bytes": await resident_memory(client, url)})
    return results, memory


async def long_prompt_words(
    url: str,
    model: str,
    context: int,
    max_tokens: int,
    api_key: str | None = None,
    fill: float = 0.85,
    margin: int = 64,
) -> int:
    """How many words (of WORDS) make a "long" prompt fill `fill` of the room that `context` leaves after max_tokens
    and `margin` (a step's draft tokens), as the server counts tokens: two one-token requests measure its tokens per
    word and its chat template's overhead."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    counts = {}
    async with httpx.AsyncClient(headers=headers, timeout=120) as client:
        for words in (16, 116):
            body = {
                "model": model,
                "max_tokens": 1,
                "messages": [{"role": "user", "content": " ".join(WORDS[i % len(WORDS)] for i in range(words))}],
            }
            r = await client.post(f"{url}/v1/chat/completions", json=body)
            r.raise_for_status()
            counts[words] = r.json()["usage"]["prompt_tokens"]
    per_word = max(0.1, (counts[116] - counts[16]) / 100)
    overhead = counts[16] - 16 * per_word
    return max(16, int((fill * (context - max_tokens - margin) - overhead) / per_word))


def ordinary_prompts(prompts: list[str], long_words: int) -> list[str]:
    """The prompts the mix draws for every kind but "long": those of at most half a long prompt's words, so that
    prompts near the context limit come as often as the mix says ("long", one kind in nine), not also with every
    long document of the prompt file (Spec-Bench's summarization and RAG prompts fill 1k tokens too)."""
    from ..errors import ConfigError

    kept = [p for p in prompts if len(p.split()) <= long_words // 2]
    if not kept:
        raise ConfigError(
            f"no prompt of the prompt file has at most {long_words // 2} words (half of a long prompt "
            "at this context): give shorter prompts or a larger --max-context"
        )
    return kept


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
