"""The server's OpenAPI 3.1 document, served at GET /openapi.json.

The request handlers read raw JSON (schemas.py validates it field by field, so that every bad value gets OpenAI's
400 with the offending `param`); FastAPI's generated document would show no request bodies at all. This one
describes what schemas.py accepts: every field of each endpoint, its type and range, the model names and drafters
of this server. tests/test_openapi.py holds the two to each other (the same field names, values at the edges of
each range accepted, just beyond them refused), and the fuzzer (bench/fuzz.py) writes its requests from it.

What JSON Schema cannot say is in the descriptions: a logit_bias key must be a token id below the vocabulary size,
`stream_options` needs `stream`, at most one of response_format and guided_* is given.
"""
from __future__ import annotations

from ..config import ACCEPTANCE_FORMS, MAX_TOP_LOGPROBS, SAMPLING_VERIFIERS
from .fields import MAX_LOGIT_BIAS, MAX_STOPS
from .messages import ROLES
from .schemas import FIELDS, IGNORED, NEUTRAL, Limits

INT64_MAX = 2**63 - 1
_FRACTION = r"0?\.[0-9]*[1-9][0-9]*"  # a decimal in (0, 1)
# what config.Acceptance.parse takes: K >= 1, 0 < P <= 1, 0 < EPS < 1 (in decimals, as clients write them)
ACCEPTANCE_PATTERN = rf"^(exact|top-k:[1-9][0-9]{{0,17}}|threshold:({_FRACTION}|1(\.0*)?)|typical:{_FRACTION})$"


def _integer(lo: int, hi: int, description: str = "") -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi, **({"description": description} if description else {})}


def _number(lo: float, hi: float, low_open: bool = False) -> dict:
    return {"type": "number", ("exclusiveMinimum" if low_open else "minimum"): lo, "maximum": hi}


def _object(properties: dict, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


BOOLEAN = {"type": "boolean"}
TEXT = {"type": "string", "minLength": 1}
JSON_SCHEMA = {"type": "object", "description": "a JSON schema"}


def _fits(limits: Limits) -> str:
    return (f"when not given: the server's default, clipped to the context left; when given, the prompt, max_tokens "
            f"and the draft length must fit the server's context of {limits.max_context} tokens, or the request is "
            f"refused (400, code context_length_exceeded)")


def _common(limits: Limits) -> dict:
    """The fields both generation endpoints take."""
    return {
        "model": {"type": "string", "enum": list(limits.model_names)},
        "max_tokens": _integer(1, limits.max_tokens, _fits(limits)),
        "temperature": _number(0.0, 2.0),
        "top_p": _number(0.0, 1.0, low_open=True),
        "top_k": _integer(-1, 10**9, "0 or -1: off"),
        "min_p": _number(0.0, 1.0),
        "stop": {"oneOf": [TEXT, {"type": "array", "items": TEXT, "maxItems": MAX_STOPS}]},
        "seed": _integer(0, INT64_MAX),
        "stream": BOOLEAN,
        "stream_options": {**_object({"include_usage": BOOLEAN}), "description": "only with stream: true"},
        "n": _integer(1, limits.max_choices),
        "ignore_eos": BOOLEAN,
        "presence_penalty": _number(-2.0, 2.0),
        "frequency_penalty": _number(-2.0, 2.0),
        "repetition_penalty": _number(0.0, 100.0, low_open=True),
        "logit_bias": {"type": "object", "maxProperties": MAX_LOGIT_BIAS, "propertyNames": {"pattern": "^[0-9]+$"},
                       "additionalProperties": _number(-100.0, 100.0),
                       "description": f"token id (below {limits.vocab_size}) -> bias"},
        "response_format": {"oneOf": [
            _object({"type": {"const": "text"}}, ("type",)),
            _object({"type": {"const": "json_object"}}, ("type",)),
            _object({"type": {"const": "json_schema"}, "json_schema": {
                "type": "object", "properties": {"name": {"type": "string"}, "schema": JSON_SCHEMA},
                "required": ["schema"]}}, ("type", "json_schema"))],
            "description": "at most one of response_format, guided_json, guided_regex, guided_grammar"},
        "guided_json": {"oneOf": [JSON_SCHEMA, {"type": "string"}]},
        "guided_regex": TEXT,
        "guided_grammar": {**TEXT, "description": "a Lark grammar"},
        "speculation": _object({
            "enabled": BOOLEAN,
            "drafter": {"type": "string", "enum": list(limits.drafters)},
            "num_speculative_tokens": _integer(0, 64),
            "sampling_verifier": {"type": "string", "enum": list(SAMPLING_VERIFIERS)},
            "adaptive": BOOLEAN,
            "acceptance": {"type": "string", "pattern": ACCEPTANCE_PATTERN,
                           "description": f"{ACCEPTANCE_FORMS}; all but exact are LOSSY (default: the server's)"}}),
    }


def _chat(limits: Limits) -> dict:
    text_part = _object({"type": {"const": "text"}, "text": {"type": "string"}}, ("type", "text"))
    call = {"type": "object", "properties": {
        "id": {"type": "string"}, "type": {"const": "function"},
        "function": {"type": "object", "properties": {"name": {"type": "string"}, "arguments": {
            "type": "string", "description": "a JSON object as text"}}, "required": ["name", "arguments"]}},
        "required": ["function"]}
    message = _object({
        "role": {"type": "string", "enum": list(ROLES)},
        "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": text_part, "minItems": 1}]},
        "name": {"type": "string"},
        "tool_calls": {"type": "array", "items": call, "description": "assistant messages only"},
        "tool_call_id": {"type": "string", "description": "tool messages: the call answered (required there)"},
    }, ("role", "content"))
    tool = _object({"type": {"const": "function"}, "function": {
        "type": "object", "properties": {"name": TEXT, "description": {"type": "string"}, "parameters": JSON_SCHEMA},
        "required": ["name"]}}, ("type", "function"))
    named = _object({"type": {"const": "function"}, "function": _object({"name": TEXT}, ("name",))},
                    ("type", "function"))
    return {
        "messages": {"type": "array", "items": message, "minItems": 1},
        "max_completion_tokens": _integer(1, limits.max_tokens, "takes precedence over max_tokens; " + _fits(limits)),
        "logprobs": BOOLEAN,
        "top_logprobs": _integer(0, MAX_TOP_LOGPROBS, "needs logprobs: true"),
        "tools": {"type": "array", "items": tool},
        "tool_choice": {"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, named],
                        "description": "\"auto\" needs the server's --tool-call-parser"},
        "parallel_tool_calls": BOOLEAN,
    }


def _completions(limits: Limits) -> dict:
    ids = {"type": "array", "items": _integer(0, limits.vocab_size - 1), "minItems": 1}
    return {
        "prompt": {"oneOf": [TEXT, ids, {"type": "array", "items": {"oneOf": [TEXT, ids]}, "minItems": 1,
                                          "maxItems": 1}], "description": "one prompt: text or token ids"},
        "logprobs": _integer(0, MAX_TOP_LOGPROBS),
        "echo": BOOLEAN,
    }


def _accepted_otherwise(endpoint: str) -> dict:
    """Fields taken for compatibility: ignored ones, and those accepted only at the value that changes nothing."""
    out = {name: {"description": "accepted and ignored"} for name in sorted(IGNORED)}
    for name, values in NEUTRAL.items():
        if name not in FIELDS[endpoint]:
            out[name] = {"enum": list(values), "description": "accepted only at this value"}
    return out


def request_schema(endpoint: str, limits: Limits) -> dict:
    """The JSON schema of a request body for `endpoint` ("chat" or "completions")."""
    own = _chat(limits) if endpoint == "chat" else _completions(limits)
    properties = {**_common(limits), **own, **_accepted_otherwise(endpoint)}
    required = ("model", "messages") if endpoint == "chat" else ("model", "prompt")
    return _object(properties, required)


ERROR = _object({"error": _object({"message": {"type": "string"}, "type": {"type": "string"},
                                   "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}},
                                  ("message", "type"))}, ("error",))


def _answers(ok: str, media: str = "application/json") -> dict:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    return {"200": {"description": ok, "content": {media: {}}}, "4XX": {"description": "an OpenAI error", **error}}


def document(limits: Limits, version: str) -> dict:
    """The OpenAPI 3.1 document of a server with these limits."""
    def generation(endpoint: str, summary: str) -> dict:
        body = {"required": True, "content": {"application/json": {"schema": {
            "$ref": f"#/components/schemas/{endpoint.capitalize()}Request"}}}}
        answers = _answers("the completion, or with stream: true a stream of server-sent events ending in [DONE]")
        answers["200"]["content"]["text/event-stream"] = {}
        return {"post": {"summary": summary, "requestBody": body, "responses": answers}}

    return {
        "openapi": "3.1.0",
        "info": {"title": "specdec", "version": version,
                 "description": "OpenAI-compatible completions with lossless speculative decoding"},
        "paths": {
            "/v1/completions": generation("completions", "a text completion"),
            "/v1/chat/completions": generation("chat", "a chat completion"),
            "/v1/models": {"get": {"summary": "the served model names", "responses": _answers("a list of models")}},
            "/health": {"get": {"summary": "liveness and capacity (503 while not ready)",
                                "responses": _answers("the server's state")}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": _answers("the text exposition format", "text/plain")}},
            "/openapi.json": {"get": {"summary": "this document", "responses": _answers("OpenAPI 3.1")}},
        },
        "components": {"schemas": {"ChatRequest": request_schema("chat", limits),
                                   "CompletionsRequest": request_schema("completions", limits), "Error": ERROR}},
    }
