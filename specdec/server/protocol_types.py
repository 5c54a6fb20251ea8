"""The typed values of the protocol's fields (protocol.py), as JSON clients send them.

pydantic's lax mode would read "8" as 8 and true as 1, and its strict mode would refuse 4.0 where an integer is
asked for, which JSON Schema calls an integer and JavaScript clients send. These validators and types take exactly
what the OpenAI API takes: integers (4.0 included; `Annotated[int, Field(ge=..., le=...), BeforeValidator(integral)]`),
finite numbers (`finite`, likewise), booleans, non-empty strings; anything else is a 400 naming the field
(validation.py). A field that is accepted only at the value that changes nothing (`best_of: 1`)
is `Annotated[Any, Neutral((1,))]`; one accepted and ignored (`user`) is `Ignored`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, StrictBool, StrictStr
from pydantic_core import PydanticCustomError, core_schema

INT64_MAX = 2**63 - 1


def integral(value: Any) -> int:
    """An integer, or a number with no fractional part; bools and strings are refused. As the last of a field's
    Annotated metadata, after its Field(ge=..., le=...), so that the bounds reach the JSON schema."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or (isinstance(value, float) and not (math.isfinite(value) and value.is_integer()))
    ):
        raise PydanticCustomError("invalid_type", "must be an integer, got {kind}", {"kind": type(value).__name__})
    return int(value)


def finite(value: Any) -> float:
    """A finite number; bools, strings, NaN and infinities are refused (placed as integral is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PydanticCustomError("invalid_type", "must be a finite number, got {kind}", {"kind": type(value).__name__})
    return float(value)


Boolean = StrictBool
Text = Annotated[StrictStr, Field(min_length=1)]  # a non-empty string
JsonSchemaObject = Annotated[dict[str, Any], Field(description="a JSON schema")]
Ignored = Annotated[Any, Field(description="accepted and ignored")]


@dataclass(frozen=True)
class Neutral:
    """Annotated metadata of a field accepted only at one of `values` (those that change nothing, e.g. best_of 1):
    any other value is refused as unsupported. Numbers compare as numbers (1 and 1.0), other values by type too."""

    values: tuple

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler) -> dict:
        return {"enum": list(self.values), "description": "accepted only at this value"}

    def check(self, value: Any) -> Any:
        if not any(value == ok and _same_kind(value, ok) for ok in self.values):
            raise PydanticCustomError(
                "unsupported_parameter",
                "is not supported by this server (only {values})",
                {"values": ", ".join(repr(v) for v in self.values)},
            )
        return value


def _same_kind(value: Any, ok: Any) -> bool:
    def number(x: Any) -> bool:
        return isinstance(x, (int, float)) and not isinstance(x, bool)

    return type(value) is type(ok) or (number(value) and number(ok))
