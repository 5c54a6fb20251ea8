"""Typed fields of a request body: integers, numbers and booleans in range, stop strings and logit_bias; a value of
the wrong type or out of range is a 400 naming the field."""
from __future__ import annotations

import math

from .errors import bad_request

MAX_STOPS = 16
MAX_LOGIT_BIAS = 1024  # entries in one request's logit_bias


def integer(body: dict, name: str, default, lo: int, hi: int, label: str | None = None):
    """body[name], an integer in [lo, hi], or `default` when absent; label: the name the error gives (a nested one)."""
    value, label = body.get(name), label or name
    if value is None:
        return default
    if not integral(value):
        raise bad_request(f"'{label}' must be an integer, got {type(value).__name__}", label, "invalid_type")
    if not lo <= value <= hi:
        span = f"{lo}" if lo == hi else f"in [{lo}, {hi}]"
        raise bad_request(f"'{label}' must be {span}, got {value}", label, "invalid_value")
    return int(value)


def integral(value) -> bool:
    """An integer, or a number with no fractional part (JSON Schema's integer: 4.0 is one, as JavaScript's
    clients send it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return isinstance(value, int) or (math.isfinite(value) and value.is_integer())


def number(body: dict, name: str, default: float, lo: float, hi: float, low_open: bool = False) -> float:
    """body[name], a finite number in [lo, hi] ((lo, hi] when low_open), or `default` when absent."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{name}' must be a number", name, "invalid_type")
    if not (lo < value if low_open else lo <= value) or value > hi:
        raise bad_request(f"'{name}' must be in {'(' if low_open else '['}{lo:g}, {hi:g}], got {value}", name,
                          "invalid_value")
    return value


def boolean(body: dict, name: str, default: bool, label: str | None = None) -> bool:
    """body[name], a boolean, or `default` when absent."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"'{label or name}' must be a boolean", label or name, "invalid_type")
    return value


def stops(value) -> tuple[str, ...]:
    """`stop`: one string or an array of them (at most MAX_STOPS, none empty)."""
    given = [value] if isinstance(value, str) else value if value is not None else []
    if not isinstance(given, list) or not all(isinstance(s, str) and s for s in given):
        raise bad_request("'stop' must be a non-empty string or an array of non-empty strings", "stop", "invalid_type")
    if len(given) > MAX_STOPS:
        raise bad_request(f"'stop' holds at most {MAX_STOPS} strings", "stop", "invalid_value")
    return tuple(given)


def logit_bias(value, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias in [-100, 100]} -> ((id, bias), ...)."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias", "invalid_type")
    if len(value) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' holds at most {MAX_LOGIT_BIAS} tokens", "logit_bias", "invalid_value")
    pairs = []
    for key, bias in value.items():
        token = int(key) if isinstance(key, str) and key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise bad_request(f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {key!r}", "logit_bias",
                              "invalid_value")
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise bad_request(f"'logit_bias' values must be numbers in [-100, 100], got {bias!r}", "logit_bias",
                              "invalid_value")
        pairs.append((token, float(bias)))
    return tuple(pairs)
