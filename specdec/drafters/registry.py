"""The drafter registry: each drafter's factory and options dataclass by name (register), and create_drafter, which
builds one for a target from a shared set of options. The built-in drafters register in drafters/__init__.py."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from ..errors import ConfigError
from .base import Drafter
from .routing.auto import auto_drafter


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Drafter | None]  # (target, options) -> Drafter, or (target) without options
    options: type | None  # the drafter's options dataclass; None: it takes none
    passes_on: bool  # also takes every option given (as a dict), for the drafters it builds in turn


_FACTORIES: dict[str, _Entry] = {}


def register(name: str, options: type | None = None, passes_on: bool = False):
    """Decorator: registers a factory `(target: LoadedModel, options) -> Drafter`, whose options are an instance of
    the frozen dataclass `options` (None: `(target) -> Drafter`, no options); passes_on: it also gets the whole
    dict of options given, as `(target, options, given)`."""

    def wrap(factory):
        _FACTORIES[name] = _Entry(factory, options, passes_on)
        return factory

    return wrap


def drafter_names() -> list[str]:
    return sorted(_FACTORIES)


def drafter_options() -> list[str]:
    """Every option some drafter takes (the fields of the registered options dataclasses)."""
    return sorted({n for entry in _FACTORIES.values() for n in _takes(entry)})


FLOAT_HEADS = ("eagle", "eagle3", "medusa")  # heads built on the target's float embeddings and LM head


def create_drafter(name: str, target, **options) -> Drafter | None:
    """Builds the drafter `name` for the LoadedModel `target`; None for "none".

    `options` is one set shared by all drafters (a server hands the same options to every drafter a request may
    pick): each drafter takes those it knows. An option no drafter knows is an error that names it."""
    unknown = sorted(set(options) - set(drafter_options()))
    if unknown:
        raise ConfigError(
            f"unknown drafter option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the "
            f"drafters take: {', '.join(drafter_options())}"
        )
    if name == "auto":
        name, options = auto_drafter(target, options)
    if name not in _FACTORIES:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: auto, {', '.join(drafter_names())}")
    if name in FLOAT_HEADS and target.backend.quantized_weights:
        from ..models.gguf_model import attach_float_tables

        attach_float_tables(target)
    entry = _FACTORIES[name]
    if entry.options is None:
        return entry.factory(target)
    own = entry.options(**{k: v for k, v in options.items() if k in _takes(entry)})
    return entry.factory(target, own, options) if entry.passes_on else entry.factory(target, own)


def _takes(entry: _Entry) -> list[str]:
    """The options a registered drafter names."""
    return [f.name for f in fields(entry.options)] if entry.options is not None else []
