"""Fuzzing an OpenAI-compatible server with requests hypothesis writes: valid, invalid and hostile ones.

Every endpoint (/v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, and paths and methods that
do not exist) gets bodies built field by field from valid values, half of them then spoiled in one to three fields
(wrong types, NaN, huge numbers, empty strings, unknown keys), and some bodies are not JSON objects at all. The rule
each answer must keep (`problem`): a 2xx in OpenAI's shape (a stream of well-formed events ending in [DONE]), or a
4xx with an OpenAI error object; never a 5xx, a malformed body, or no answer within the timeout; and the server
serves the next request. hypothesis and httpx are the `dev` extra's.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

GENERATION = ("/v1/completions", "/v1/chat/completions")


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    body: bytes | None = None


@dataclass
class FuzzReport:
    requests: int = 0
    by_status: dict[str, int] = field(default_factory=dict)
    problems: list[dict] = field(default_factory=list)  # the first ones, with their requests

    def add(self, request: FuzzRequest, status: int | None, issue: str | None) -> None:
        self.requests += 1
        key = "no answer" if status is None else f"{status // 100}xx"
        self.by_status[key] = self.by_status.get(key, 0) + 1
        if issue and len(self.problems) < 20:
            self.problems.append({"method": request.method, "path": request.path, "problem": issue,
                                  "body": (request.body or b"")[:500].decode("utf-8", "replace")})

    def as_dict(self) -> dict:
        return {"requests": self.requests, "by_status": self.by_status, "problems": len(self.problems),
                "first_problems": self.problems}


def requests(model: str, vocab: int = 1000):
    """A hypothesis strategy of FuzzRequests against a server serving `model`."""
    from hypothesis import strategies as st

    junk = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(), st.text(max_size=12),
                     st.lists(st.integers(-3, 5), max_size=3), st.dictionaries(st.text(max_size=4), st.integers(),
                                                                              max_size=2))

    text = st.text(max_size=40)
    common = {
        "model": st.just(model),
        "max_tokens": st.integers(1, 6),
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0.05, 1), "top_k": st.integers(-1, 50),
        "n": st.integers(1, 3), "seed": st.integers(0, 2 ** 63 - 1),
        "stop": st.one_of(text, st.lists(st.text(min_size=1, max_size=6), max_size=4)),
        "stream": st.booleans(),
        "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
        "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.5, 2),
        "logit_bias": st.dictionaries(st.integers(0, vocab).map(str), st.floats(-100, 100), max_size=3),
        "ignore_eos": st.booleans(),
        "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}, {
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {
                "a": {"type": "integer"}}, "required": ["a"]}}}]),
        "speculation": st.fixed_dictionaries({}, optional={
            "drafter": st.sampled_from(["none", "auto", "ngram", "suffix", "eagle", "nonsense"]),
            "num_speculative_tokens": st.integers(-1, 12), "adaptive": st.booleans()}),
        "user": text,
    }
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]), "content": text})
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    chat_fields = {**common, "logprobs": st.booleans(), "top_logprobs": st.integers(0, 5),
                   "max_completion_tokens": st.integers(1, 6), "tools": st.just([tool]),
                   "tool_choice": st.sampled_from(["auto", "none", "required",
                                                   {"type": "function", "function": {"name": "get_weather"}}])}
    completion_fields = {**common, "logprobs": st.integers(0, 5), "echo": st.booleans()}
    chat = st.fixed_dictionaries({"model": st.just(model), "messages": st.lists(message, min_size=1, max_size=3)},
                                 optional={k: v for k, v in chat_fields.items() if k != "model"})
    completion = st.fixed_dictionaries({"model": st.just(model), "prompt": st.one_of(
        text, st.lists(st.integers(0, vocab), min_size=1, max_size=8))},
        optional={k: v for k, v in completion_fields.items() if k != "model"})

    def spoiled(bodies, fields):
        """Half the bodies as they are; the others with one to three fields (or an unknown one) set to junk."""
        keys = st.sampled_from(sorted(fields) + ["messages", "prompt", "unknown_field"])
        changes = st.one_of(st.just([]), st.lists(st.tuples(keys, junk), min_size=1, max_size=3))
        return st.tuples(bodies, changes).map(lambda pair: {**pair[0], **dict(pair[1])})

    chat, completion = spoiled(chat, chat_fields), spoiled(completion, completion_fields)

    def encoded(body) -> bytes:
        return json.dumps(body, allow_nan=True).encode()

    raw = st.one_of(st.binary(max_size=40), st.sampled_from([b"", b"{", b"[]", b"null", b'"x"', b"{\"a\": 1}",
                                                             b'{"prompt": "x", "model": NaN}']))
    generation = st.one_of(
        st.builds(FuzzRequest, st.just("POST"), st.just("/v1/completions"), completion.map(encoded)),
        st.builds(FuzzRequest, st.just("POST"), st.just("/v1/chat/completions"), chat.map(encoded)),
        st.builds(FuzzRequest, st.just("POST"), st.sampled_from(GENERATION), raw))
    other = st.one_of(
        st.builds(FuzzRequest, st.sampled_from(["GET", "POST", "DELETE"]),
                  st.sampled_from(["/v1/models", "/health", "/metrics", "/v1/nothing", "/", "/v1/completions/x"])),
        st.builds(FuzzRequest, st.just("GET"), st.sampled_from(GENERATION)))
    return st.one_of(generation, generation, generation, other)


def problem(request: FuzzRequest, status: int | None, content_type: str, body: bytes) -> str | None:
    """What is wrong with an answer to `request`, or None."""
    if status is None:
        return "no answer within the timeout"
    if status >= 500:
        return f"status {status}"
    if status >= 400:
        return _error_problem(body)
    if request.path == "/metrics":
        return None if body.startswith(b"#") else "metrics are not in Prometheus' text format"
    if "text/event-stream" in content_type:
        return _stream_problem(body)
    try:
        answer = json.loads(body)
    except ValueError:
        return "a 2xx answer is not JSON"
    if request.path in GENERATION:
        return _completion_problem(answer)
    if request.path == "/v1/models":
        return None if answer.get("object") == "list" and answer.get("data") else "bad /v1/models answer"
    return None


def _error_problem(body: bytes) -> str | None:
    try:
        error = json.loads(body)["error"]
        ok = isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
    except (ValueError, KeyError, TypeError):
        ok = False
    return None if ok else f"a 4xx answer without an OpenAI error object: {body[:200]!r}"


def _completion_problem(answer) -> str | None:
    if not isinstance(answer, dict) or answer.get("object") not in ("text_completion", "chat.completion"):
        return "a 2xx generation answer without its object type"
    choices = answer.get("choices")
    if not isinstance(choices, list) or not choices or not all("finish_reason" in c for c in choices):
        return "a 2xx generation answer without choices"
    if not isinstance(answer.get("usage"), dict):
        return "a 2xx generation answer without usage"
    return None


def _stream_problem(body: bytes) -> str | None:
    events = [line[6:] for line in body.decode("utf-8", "replace").split("\n") if line.startswith("data: ")]
    if not events or events[-1].strip() != "[DONE]":
        return "a stream that does not end with [DONE]"
    for event in events[:-1]:
        try:
            data = json.loads(event)
        except ValueError:
            return f"a stream event that is not JSON: {event[:100]!r}"
        if "error" in data and data["error"].get("type") == "server_error":
            return f"a server error in a stream: {data['error'].get('message')}"
    return None


def fuzz(url: str, model: str, count: int, seed: int = 0, api_key: str | None = None, timeout: float = 60.0,
         vocab: int = 1000, stop_at_first: bool = False) -> FuzzReport:
    """Sends `count` requests hypothesis writes (seeded) to the server at `url`, one at a time; with
    stop_at_first, the first problem raises AssertionError (hypothesis then shrinks it to a smallest request)."""
    import httpx
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    report = FuzzReport()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    @hypothesis_seed(seed)
    @settings(max_examples=count, deadline=None, database=None, suppress_health_check=list(HealthCheck),
              phases=list(Phase) if stop_at_first else [Phase.generate])
    @given(requests(model, vocab))
    def one(request: FuzzRequest) -> None:
        try:
            answer = client.request(request.method, request.path, content=request.body,
                                    headers={"Content-Type": "application/json"} if request.body is not None else {})
            status, content_type, body = answer.status_code, answer.headers.get("content-type", ""), answer.content
        except httpx.TimeoutException:
            status, content_type, body = None, "", b""
        issue = problem(request, status, content_type, body)
        report.add(request, status, issue)
        if issue and stop_at_first:
            raise AssertionError(f"{request.method} {request.path} {request.body!r}: {issue}")

    try:
        one()
        alive = client.get("/health")
        if alive.status_code != 200:
            report.problems.append({"problem": f"/health answered {alive.status_code} after the run"})
    finally:
        client.close()
    return report
