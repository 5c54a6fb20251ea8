"""A body the protocol's models refuse (pydantic's errors, or FastAPI's RequestValidationError) -> a 400 in OpenAI's
format: the first error's message, the field it concerns as `param` ("messages[0].role", "speculation.drafter")
and a code (missing_required_parameter, unrecognized_argument, invalid_type, invalid_value, unsupported_parameter,
invalid_json)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from .errors import APIError

M = TypeVar("M", bound=BaseModel)

# pydantic names the member of a union it tried in an error's location ("str", "list[int]", "function-after[...]",
# "NamedToolChoice"); the protocol's fields are snake_case words, never a builtin type's name
_FIELD = re.compile(r"^[a-z_][a-z0-9_]*$")
_MAPS = {"logit_bias"}  # objects whose keys are the client's (token ids): a param names the map, not the key
_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none", "any"}
_CODES = {
    "missing": "missing_required_parameter",
    "extra_forbidden": "unrecognized_argument",
    "json_invalid": "invalid_json",
    "unsupported_parameter": "unsupported_parameter",
    "invalid_type": "invalid_type",
}


def param(location: tuple) -> str | None:
    """A pydantic error's location as OpenAI's param: fields joined by dots, list indices in brackets. It ends where
    a union's member is named (a value that may take several shapes is named whole: "stop", "prompt",
    "messages[0].content") and after a map whose keys are the client's."""
    out = ""
    for item in location:
        if isinstance(item, int):
            out += f"[{item}]"
            continue
        if not (isinstance(item, str) and _FIELD.match(item)) or item in _TYPE_TAGS:
            break
        out += f".{item}" if out else item
        if item in _MAPS:
            break
    return out or None


def validated(model: type[M], body: object) -> M:
    """`body` validated by one of the protocol's models; what it refuses is the APIError (400) api_error makes."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise api_error(exc.errors()) from None


def _code(kind: str) -> str:
    if kind in _CODES:
        return _CODES[kind]
    return "invalid_type" if kind.endswith(("_type", "_parsing")) or kind == "is_instance_of" else "invalid_value"


def api_error(errors: Sequence[Mapping[str, Any]]) -> APIError:
    """The APIError (400) for pydantic's list of errors (ValidationError.errors()); its first error speaks. A
    location that begins with "body" (FastAPI's) is read from after it."""
    if not errors:
        return APIError(400, "The request body is not valid", code="invalid_value")
    first = _telling(errors)
    location = _after_body(first.get("loc", ()))
    kind = first.get("type", "")
    if kind == "json_invalid":
        return APIError(
            400, "We could not parse the JSON body of your request: it is not valid JSON", code="invalid_json"
        )
    if kind == "extra_forbidden":
        name = param(location[:-1])
        unknown = f"{name}.{location[-1]}" if name else str(location[-1])
        return APIError(
            400, f"Unrecognized request argument supplied: {unknown}", param=unknown, code="unrecognized_argument"
        )
    where = param(location)
    if kind == "missing":
        return APIError(400, f"'{where}' is required", param=where, code="missing_required_parameter")
    if kind in ("model_type", "model_attributes_type", "dict_type") and where is None:
        return APIError(400, "The request body must be a JSON object", code="invalid_type")
    # the other members of a union at the same place, each in its own words
    said = (
        []
        if kind == "unsupported_parameter"
        else [
            str(e.get("msg", "is not valid"))
            for e in errors
            if param(_after_body(e.get("loc", ()))) == where and len(e.get("loc", ())) == len(first.get("loc", ()))
        ]
    )
    message = " or ".join(dict.fromkeys([str(first.get("msg", "is not valid"))] + said))
    return APIError(400, f"'{where}': {message}" if where else message, param=where, code=_code(kind))


def _telling(errors: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    """The error that tells most about the first field refused: a union's members each give one, and the member
    that took the value's shape got furthest (a list of stop strings holding an empty one: the list's error, not
    "should be a string"); one the protocol raised itself says most (text parts only)."""
    field = _after_body(errors[0].get("loc", ()))[:1]
    same = [e for e in errors if _after_body(e.get("loc", ()))[:1] == field]
    own = [e for e in same if e.get("type") == "unsupported_parameter"]
    return own[0] if own else max(same, key=lambda e: len(e.get("loc", ())))


def _after_body(location) -> tuple:
    location = tuple(location)
    return location[1:] if location[:1] == ("body",) else location
