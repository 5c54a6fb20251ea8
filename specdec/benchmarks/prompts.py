"""Spec-Bench prompts: JSONL lines with question_id, category and turns (the first turn is the prompt)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import ConfigError
from ..files import read_lines

T = TypeVar("T")


@dataclass(frozen=True)
class BenchPrompt:
    question_id: str
    category: str
    text: str
    follow_ups: tuple[str, ...] = ()  # the later turns of a multi-turn question


def load_prompts(path: str | Path, limit: int | None = None) -> list[BenchPrompt]:
    """Reads the file; with `limit`, picks prompts round-robin across categories (in file order)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"prompt file not found: {path}")
    prompts = []
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            turns = row["turns"]
            text = turns[0] if isinstance(turns, list) else turns
            if not isinstance(text, str) or not text.strip():
                raise ValueError("the first turn is not a non-empty string")
            later = tuple(t for t in turns[1:] if isinstance(t, str) and t.strip()) if isinstance(turns, list) else ()
            prompts.append(
                BenchPrompt(str(row.get("question_id", number)), str(row.get("category", "default")), text, later)
            )
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f"{path}:{number}: not a Spec-Bench line ({exc})") from None
    if not prompts:
        raise ConfigError(f"{path} holds no prompts")
    if limit is not None:
        if limit < 1:
            raise ConfigError(f"--limit must be >= 1, got {limit}")
        prompts = round_robin(prompts, limit)
    return prompts


def round_robin(items: list[T], limit: int | None, key: Callable[[T], str] | None = None) -> list[T]:
    """Takes the first item of each group (by `key`, default: category) in turn, then the second of each, and
    so on, up to `limit` items (None: all)."""
    group_of = key or (lambda item: item.category)  # type: ignore[attr-defined]
    by_group: dict[str, list[T]] = {}
    for item in items:
        by_group.setdefault(group_of(item), []).append(item)
    limit = len(items) if limit is None else limit
    picked: list[T] = []
    depth = 0
    while len(picked) < limit and any(depth < len(v) for v in by_group.values()):
        for group in by_group.values():
            if depth < len(group) and len(picked) < limit:
                picked.append(group[depth])
        depth += 1
    return picked
