"""The fuzzer's oracle (fuzz.py): what is wrong with a server's answer, or nothing. A 2xx must be in OpenAI's shape
(a generation with its object type, choices and usage; a stream of JSON events ending in [DONE] with no server
error among them; the model list; Prometheus' text), a 4xx must carry OpenAI's error object, and a 5xx or no
answer at all is always wrong."""

from __future__ import annotations

import json
from typing import Protocol

GENERATION = ("/v1/completions", "/v1/chat/completions")


class Sent(Protocol):
    """What the oracle reads of a request (fuzz.FuzzRequest): where it went."""

    @property
    def path(self) -> str: ...


def problem(request: Sent, status: int | None, content_type: str, body: bytes) -> str | None:
    """What is wrong with an answer to `request` (fuzz.FuzzRequest), or None."""
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
