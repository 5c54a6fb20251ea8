"""Fuzzing an OpenAI-compatible server with requests hypothesis writes: valid, invalid and hostile ones.

The requests are written from the server's own OpenAPI document (GET /openapi.json, server/document.py) by
schemathesis: bodies valid by its schemas for /v1/completions and /v1/chat/completions and bodies it makes
invalid, valid ones spoiled in one to three fields (wrong types, NaN, huge numbers, empty strings, unknown keys),
bodies that are not JSON objects at all, every GET path it names, and paths and methods it does not name. The rule
each answer must keep (`problem`, fuzz_answers.py): a 2xx in OpenAI's shape (a stream of well-formed events ending
in [DONE]), or a 4xx with an OpenAI error object; never a 5xx, a malformed body, or no answer within the timeout;
and the server serves the next request. schemathesis (with hypothesis) and httpx are the `dev` extra's.

A seed writes the same requests in every process of an installed specdec (`drawn`; the report's digest): see
benchmarks/seeded.py. That also makes a long run resumable: with a journal (`FuzzJournal`), each answered
request's outcome is appended as it comes, and a rerun replays the recorded ones instead of sending them again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .fuzz_answers import GENERATION, problem
from .fuzz_journal import FuzzJournal
from .seeded import run_seeded


@dataclass(frozen=True)
class FuzzRequest:
    method: str
    path: str
    body: bytes | None = None


@dataclass
class FuzzReport:
    requests: int = 0
    replayed: int = 0  # of `requests`, those read from a journal instead of sent
    by_status: dict[str, int] = field(default_factory=dict)
    problems: list[dict] = field(default_factory=list)  # the first ones, with their requests
    hash: Any = field(default_factory=hashlib.sha256, repr=False)  # of every request sent, in order

    def add(self, request: FuzzRequest, status: int | None, issue: str | None) -> None:
        self.requests += 1
        self.hash.update(_identity(request))
        key = "no answer" if status is None else f"{status // 100}xx"
        self.by_status[key] = self.by_status.get(key, 0) + 1
        if issue and len(self.problems) < 20:
            self.problems.append(
                {
                    "method": request.method,
                    "path": request.path,
                    "problem": issue,
                    "body": (request.body or b"")[:500].decode("utf-8", "replace"),
                }
            )

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "replayed_from_journal": self.replayed,
            "requests_digest": self.hash.hexdigest()[:16],
            "by_status": self.by_status,
            "problems": len(self.problems),
            "first_problems": self.problems,
        }


def _short_digest(request: FuzzRequest) -> str:
    return hashlib.sha256(_identity(request)).hexdigest()[:16]


def _identity(request: FuzzRequest) -> bytes:
    return json.dumps([request.method, request.path, (request.body or b"").hex()]).encode() + b"\n"


def digest(requests: list[FuzzRequest]) -> str:
    """A short digest of requests in order: equal for the same requests (FuzzReport's requests_digest)."""
    out = hashlib.sha256()
    for request in requests:
        out.update(_identity(request))
    return out.hexdigest()[:16]


# the fuzzer keeps generations short and bodies small: the schema's ranges are the server's, these are the run's
TIGHTER = {
    "max_tokens": {"maximum": 6},
    "max_completion_tokens": {"maximum": 6},
    "n": {"maximum": 3},
    "top_logprobs": {"maximum": 5},
    "logprobs": {"maximum": 5},
    "messages": {"maxItems": 3},
    "stop": {"maxItems": 4},
    "tools": {"maxItems": 2},
    "logit_bias": {"maxProperties": 3},
}


def fuzz_document(document: dict) -> dict:
    """The OpenAPI document with its request schemas resolved and cut to fuzzing sizes (TIGHTER; strings of at
    most 40 characters, arrays of at most 8 items), for schemathesis to write requests from."""
    schemas = document["components"]["schemas"]

    def resolve(node: Any, name: str | None = None) -> Any:
        if isinstance(node, list):
            return [resolve(x) for x in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            return resolve(schemas[node["$ref"].rsplit("/", 1)[1]], name)
        out: dict[str, Any] = {
            k: {n: resolve(sub, n) for n, sub in v.items()} if k == "properties" else resolve(v)
            for k, v in node.items()
        }
        if out.get("type") == "string" and "enum" not in out:
            out["maxLength"] = min(out.get("maxLength", 40), 40)
        if out.get("type") == "array":
            out["maxItems"] = min(out.get("maxItems", 8), 8)
        return {**out, **TIGHTER.get(name or "", {})}  # size keywords bind only values of their type: safe on any node

    cut = {name: resolve(schema) if name.endswith("Request") else schema for name, schema in schemas.items()}
    return {**document, "components": {**document["components"], "schemas": cut}}


def requests(document: dict):
    """A hypothesis strategy of FuzzRequests written from a server's OpenAPI document: for each POST operation,
    bodies valid by its schema and bodies schemathesis makes invalid, valid ones spoiled in one to three fields by
    junk of any type, and bodies that are not JSON objects at all; every GET path it names; and paths and methods
    it does not name."""
    import schemathesis
    from hypothesis import strategies as st
    from schemathesis import GenerationMode

    junk = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**70), 2**70),
        st.floats(),
        st.text(max_size=12),
        st.lists(st.integers(-3, 5), max_size=3),
        st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
    )

    def spoiled(bodies, fields):
        """Bodies with one to three fields (or an unknown one) set to junk."""
        keys = st.sampled_from(sorted(fields) + ["unknown_field"])
        changes = st.lists(st.tuples(keys, junk), min_size=1, max_size=3)
        return st.tuples(bodies, changes).map(lambda pair: {**pair[0], **dict(pair[1])})

    document = fuzz_document(document)
    # the default configuration, not a schemathesis.toml found above the working directory
    schema = schemathesis.openapi.from_dict(document, config=schemathesis.config.SchemathesisConfig())
    posts = []
    for path, operations in document["paths"].items():
        if "post" not in operations:
            continue
        ref = operations["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        fields = document["components"]["schemas"][ref.rsplit("/", 1)[1]]
        operation = schema[path]["POST"]
        # schemathesis' GenerationMode members read as plain strings to mypy
        valid = operation.as_strategy(GenerationMode.POSITIVE).map(lambda case: case.body)  # type: ignore[arg-type]
        invalid = operation.as_strategy(GenerationMode.NEGATIVE).map(lambda case: case.body)  # type: ignore[arg-type]
        bodies = st.one_of(valid, valid, invalid, spoiled(valid, fields["properties"]))
        posts.append(st.builds(FuzzRequest, st.just("POST"), st.just(path), bodies.map(_encoded)))
    gets = sorted(p for p, ops in document["paths"].items() if "get" in ops)
    raw = st.one_of(
        st.binary(max_size=40),
        st.sampled_from([b"", b"{", b"[]", b"null", b'"x"', b'{"a": 1}', b'{"prompt": "x", "model": NaN}']),
    )
    generation = st.one_of(*posts, st.builds(FuzzRequest, st.just("POST"), st.sampled_from(GENERATION), raw))
    other = st.one_of(
        st.builds(
            FuzzRequest,
            st.sampled_from(["GET", "POST", "DELETE"]),
            st.sampled_from(gets + ["/v1/nothing", "/", "/v1/completions/x"]),
        ),
        st.builds(FuzzRequest, st.just("GET"), st.sampled_from(GENERATION)),
    )
    return st.one_of(generation, generation, generation, other)


def _encoded(body) -> bytes:
    """The body as sent: JSON (NaN and infinities included, as hostile clients send them), or raw bytes."""
    if isinstance(body, (bytes, bytearray)):
        return bytes(body)
    return json.dumps(body, allow_nan=True, default=str).encode()


def drawn(document: dict, count: int, seed: int = 0) -> list[FuzzRequest]:
    """The `count` requests that fuzz() sends a server with this OpenAPI document for `seed` (without one)."""
    out: list[FuzzRequest] = []
    run_seeded(requests(document), count, seed, False, out.append)
    return out


def fuzz(
    url: str,
    model: str,
    count: int,
    seed: int = 0,
    api_key: str | None = None,
    timeout: float = 60.0,
    stop_at_first: bool = False,
    journal: FuzzJournal | None = None,
) -> FuzzReport:
    """Sends `count` requests hypothesis writes (seeded: the same in every run) to the server at `url`, one at a
    time; with stop_at_first, the first problem raises AssertionError (hypothesis then shrinks it to a smallest
    request). With a journal, requests it holds are not sent again (report.replayed counts them)."""
    import httpx

    report = FuzzReport()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.Client(base_url=url, headers=headers, timeout=timeout)

    document = client.get("/openapi.json")
    if document.status_code != 200:
        client.close()
        raise ConfigError(
            f"{url}/openapi.json answered {document.status_code}: the fuzzer writes its requests "
            "from the server's OpenAPI document"
        )

    def one(request: FuzzRequest) -> None:
        past = journal.recorded(report.requests, _short_digest(request)) if journal else None
        if past is not None:
            report.replayed += 1
            report.add(request, past["status"], past["problem"])
            return
        try:
            answer = client.request(
                request.method,
                request.path,
                content=request.body,
                headers={"Content-Type": "application/json"} if request.body is not None else {},
            )
            status, content_type, body = answer.status_code, answer.headers.get("content-type", ""), answer.content
        except httpx.TimeoutException:
            status, content_type, body = None, "", b""
        issue = problem(request, status, content_type, body)
        if journal:
            journal.record(_short_digest(request), status, issue)
        report.add(request, status, issue)
        if issue and stop_at_first:
            raise AssertionError(f"{request.method} {request.path} {request.body!r}: {issue}")

    try:
        run_seeded(requests(document.json()), count, seed, stop_at_first, one)
        alive = client.get("/health")
        if alive.status_code != 200:
            report.problems.append({"problem": f"/health answered {alive.status_code} after the run"})
    finally:
        client.close()
    return report
