"""Text documents from the user's files, for `specdec suffix-index build`.

An input is a text file (one document), a folder (walked in name order; names starting with "." are skipped) or a
.jsonl file, where each record gives one document per field found, the first of: `text` (a whole document),
`completion` (a prompt/completion pair's answer), `messages` (each assistant turn of a chat; user and system
turns are not what the model writes). Files holding a NUL byte or not decoding as UTF-8 are skipped and counted.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import ConfigError


@dataclass
class Corpus:
    documents: list[str] = field(default_factory=list)
    files: int = 0  # read as text
    skipped_files: int = 0  # binary, not UTF-8, or unreadable
    skipped_records: int = 0  # JSONL records with none of the fields above


def check_inputs(inputs: list[str]) -> None:
    """Raises a one-line ConfigError for the first input that does not exist."""
    if not inputs:
        raise ConfigError("no input given: pass text files, folders or .jsonl files")
    for name in inputs:
        if not Path(name).exists():
            raise ConfigError(f"input not found: {name}")


def read_corpus(inputs: list[str]) -> Corpus:
    """The documents of every input, in the order given."""
    check_inputs(inputs)
    corpus = Corpus()
    for name in inputs:
        path = Path(name)
        for file in _walk(path) if path.is_dir() else [path]:
            _read_file(file, corpus)
    return corpus


def _walk(folder: Path):
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        yield from (Path(root) / f for f in sorted(files) if not f.startswith("."))


def _read_file(path: Path, corpus: Corpus) -> None:
    text = _text(path)
    if text is None:
        corpus.skipped_files += 1
        return
    corpus.files += 1
    if path.suffix.lower() == ".jsonl":
        for number, line in enumerate(text.split("\n"), 1):  # not splitlines: JSON strings may hold U+2028
            if line.strip():
                found = record_documents(_parse(line, path, number))
                corpus.documents.extend(found)
                corpus.skipped_records += not found
    elif text.strip():
        corpus.documents.append(text)


def _text(path: Path) -> str | None:
    """The file's text; None when it cannot be read, holds a NUL byte (binary) or is not UTF-8."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None


def _parse(line: str, path: Path, number: int):
    try:
        return json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}:{number}: not valid JSON ({exc.msg})") from None


def record_documents(record) -> list[str]:
    """The documents of one JSONL record: its `text`, else its `completion`, else its chat's assistant turns.

    Example: {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!"}]}
    -> ["Hello!"].
    """
    if not isinstance(record, dict):
        return []
    for key in ("text", "completion"):
        if isinstance(record.get(key), str):
            return [record[key]] if record[key].strip() else []
    turns = record.get("messages")
    if not isinstance(turns, list):
        return []
    out = []
    for turn in turns:
        if isinstance(turn, dict) and turn.get("role") == "assistant":
            content = turn.get("content")
            if isinstance(content, list):  # OpenAI content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
            if isinstance(content, str) and content.strip():
                out.append(content)
    return out


def pieces(ids: list[int], size: int) -> list[list[int]]:
    """`ids` cut into runs of at most `size` tokens (the index forgets whole runs, oldest first)."""
    return [ids[i : i + size] for i in range(0, len(ids), size)]
