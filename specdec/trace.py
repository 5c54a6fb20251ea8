"""Acceptance traces: one JSON line per ended request, for `specdec replay` (specdec/replay.py) to work out what
other drafters and draft lengths would have done on the same traffic, without the model.

    {"type": "header", "model": ..., "verify_costs_s": {"1": 0.011, "2": 0.012, ...}, ...}
    {"type": "request", "prompt_ids": [...], "output_ids": [...], "steps": [[drafted, accepted], ...], ...}

A trace holds the token ids of every prompt and output (their text, in effect): it is written only when asked for
(`--trace FILE`), appended to, and should be kept as private as the requests themselves.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import threading
import time
from pathlib import Path

from .errors import ConfigError
from .files import read_lines


class TraceWriter:
    """Appends request records to a JSONL file; a header with the verify cost curve opens each writer's part."""

    def __init__(self, path: str | Path, model: str, verify_costs: dict[int, float]):
        """path: a file to append to, or a folder (an existing one, or a path ending in '/'): each writer then
        opens its own file there, named by its start time and process."""
        self.path = Path(path)
        if self.path.is_dir() or str(path).endswith(("/", "\\")):
            self.path = self.path / f"trace-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.jsonl"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = self.path.open("a", encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot write the trace file {self.path}: {exc.strerror or exc}") from None
        self._lock = threading.Lock()
        self._good = self._file.tell()  # the end of the last complete record
        self.dropped = 0  # records not written (a full disk, an I/O error): generation goes on without them
        self._line(
            {
                "type": "header",
                "model": model,
                "created": time.time(),
                "machine": platform.machine(),
                "processor": platform.processor(),
                "verify_costs_s": {str(t): s for t, s in sorted(verify_costs.items())},
            }
        )

    def write(self, state) -> None:
        """One ended request (a Request that kept its step log)."""
        config, m = state.config, state.metrics
        self._line(
            {
                "type": "request",
                "drafter": state.drafter.name if state.drafter is not None else "none",
                "k_max": state.k_max,
                "adaptive": state.adaptive,
                "greedy": config.sampling.greedy,
                "constrained": config.constraint is not None,
                "max_new_tokens": config.max_new_tokens,
                "finish_reason": state.finished or m.finish_reason,
                "prompt_ids": state.tokens[: state.prompt_len],
                "output_ids": state.generated,
                "steps": state.step_log,
                "prefill_s": m.prefill_time_s,
                "draft_s": m.draft_time_s,
                "verify_s": m.verify_time_s,
                "acceptance": m.acceptance,
            }
        )

    def _line(self, record: dict) -> None:
        """Appends one record; a failed write (a full disk) is cut back to the last complete record, logged once
        and counted, and never reaches the request that ended."""
        with self._lock:
            try:
                self._file.write(json.dumps(record, separators=(",", ":")) + "\n")
                self._file.flush()
                self._good = self._file.tell()
            except OSError as exc:
                self.dropped += 1
                if self.dropped == 1:
                    logging.getLogger("specdec.trace").error(
                        "cannot write the trace %s (%s): requests go on, unrecorded", self.path, exc.strerror or exc
                    )
                try:
                    self._file.seek(self._good)
                    self._file.truncate()
                except (OSError, ValueError):
                    pass

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_trace(path: str | Path) -> tuple[dict[int, float], list[dict]]:
    """(the first header's verify costs {tokens scored: seconds}, the request records in order)."""
    costs, requests, _ = read_trace_with_model(path)
    return costs, requests


def read_trace_with_model(path: str | Path) -> tuple[dict[int, float], list[dict], str]:
    """read_trace, and the model its first header names ("" where it names none)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"trace file not found: {path}")
    costs, requests, model = None, [], ""
    for number, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if record["type"] == "header":
                if costs is None:
                    model = str(record.get("model") or "")
                costs = costs or {int(t): float(s) for t, s in record["verify_costs_s"].items()}
            elif record["type"] == "request":
                if not (
                    isinstance(record["prompt_ids"], list)
                    and isinstance(record["output_ids"], list)
                    and isinstance(record["steps"], list)
                ):
                    raise ValueError("prompt_ids, output_ids and steps must be lists")
                requests.append(record)
        except (ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"{path}:{number}: not a specdec trace line ({exc})") from None
    if costs is None or not costs:
        raise ConfigError(f"{path} has no header with verify costs (write traces with `--trace FILE`)")
    if not requests:
        raise ConfigError(f"{path} holds no requests")
    return costs, requests, model
