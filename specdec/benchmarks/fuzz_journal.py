"""A fuzz run's journal, so that a run of thousands of requests stopped at any point resumes (bench/fuzz.py)."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import ConfigError


class FuzzJournal:
    """One JSON line per answered request: its position, a digest of the request, its status and its problem.

    A rerun with the same journal, seed and server document draws the same requests; those already recorded are
    counted from the journal (their digests must match, or the journal belongs to another run and is refused) and
    only the rest are sent. A line cut short by a kill is dropped."""

    def __init__(self, path) -> None:
        self.path = Path(path)
        self.done: list[dict] = []
        if self.path.exists():
            lines = self.path.read_bytes().split(b"\n")
            for line in lines:
                try:
                    self.done.append(json.loads(line))
                except ValueError:
                    break  # the last line, half-written when the run was stopped
            keep = b"".join(line + b"\n" for line in lines[: len(self.done)])
            if len(keep) != self.path.stat().st_size:
                self.path.write_bytes(keep)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = open(self.path, "a", encoding="utf-8")

    def recorded(self, index: int, digest: str) -> dict | None:
        """The recorded outcome of the index-th request, or None when it was not answered yet."""
        if index >= len(self.done):
            return None
        entry = self.done[index]
        if not isinstance(entry, dict) or entry.get("request") != digest:
            raise ConfigError(
                f"fuzz journal {self.path} was written for other requests (another --seed, or another "
                f"server document) at request {index}: give a new journal file, or remove this one"
            )
        return entry

    def record(self, digest: str, status: int | None, issue: str | None) -> None:
        entry = {"i": len(self.done), "request": digest, "status": status, "problem": issue}
        self.done.append(entry)
        self.file.write(json.dumps(entry) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
