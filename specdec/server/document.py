"""The server's OpenAPI document (GET /openapi.json): FastAPI's, written from the protocol's models (protocol.py,
protocol_responses.py), with this server's own names and limits put in: the model names and drafters it takes,
the most choices (`n`) and tokens (`max_tokens`) a request may ask for, the token ids its vocabulary holds. The
fuzzer (benchmarks/fuzz.py) writes its requests from it."""

from __future__ import annotations

from fastapi.openapi.utils import get_openapi

from .protocol import FITS, ChatRequest, CompletionsRequest
from .routes import router
from .schemas import Limits

DESCRIPTION = "OpenAI-compatible completions with lossless speculative decoding"
REQUESTS = (CompletionsRequest, ChatRequest)


def openapi_document(limits: Limits, version: str) -> dict:
    """The OpenAPI 3.1 document of a server with these limits."""
    document = get_openapi(title="specdec", version=version, description=DESCRIPTION, routes=router.routes)
    schemas = document["components"]["schemas"]
    schemas.update(_exact_schemas(set(schemas)))
    fits = FITS.format(of=f" of {limits.max_context} tokens")
    for model in REQUESTS:
        fields = schemas[model.__name__]["properties"]
        fields["model"]["enum"] = list(limits.model_names)
        fields["n"]["maximum"] = limits.max_choices
        for tokens in ("max_tokens", "max_completion_tokens"):
            if tokens in fields:
                fields[tokens].update(maximum=limits.max_tokens, description=fits)
    _each_integer(schemas["CompletionsRequest"]["properties"]["prompt"], maximum=limits.vocab_size - 1)
    schemas["Speculation"]["properties"]["drafter"]["anyOf"][0]["enum"] = list(limits.drafters)
    return document


def _exact_schemas(names: set[str]) -> dict:
    """The protocol's schemas as pydantic writes them: FastAPI's OpenAPI model keeps bounds as floats, and a float
    is not an exact bound for an integer beyond 2**53 (a seed's 2**63 - 1)."""
    out = {}
    for model in REQUESTS:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        out.update({name: sub for name, sub in schema.pop("$defs", {}).items() if name in names})
        # a null field of a request is the field left out (protocol.GenerationBody): each shows its own type
        schema["properties"] = {name: _not_null(field) for name, field in schema["properties"].items()}
        out[model.__name__] = schema
    return out


def _not_null(field: dict) -> dict:
    """A field's schema without its null member (anyOf [X, null] -> X, keeping the field's title and description)."""
    members = [m for m in field.get("anyOf", []) if m.get("type") != "null"]
    if len(members) != 1 or len(members) == len(field["anyOf"]):
        return field
    rest = {key: value for key, value in field.items() if key not in ("anyOf", "default")}
    return {**members[0], **rest}


def _each_integer(node, **keywords) -> None:
    """Sets keywords on every integer schema within `node` (a prompt's token ids)."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            node.update(keywords)
        for value in node.values():
            _each_integer(value, **keywords)
    elif isinstance(node, list):
        for value in node:
            _each_integer(value, **keywords)
