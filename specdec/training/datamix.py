"""Training data mixes: which records a drafter learns from, and in what order they are extracted.

A mix is several JSONL files, each with a weight (`--data FILE[:WEIGHT]`). One record a line:
  {"prompt": str, "response": str (optional), "source": str (optional)}
- a record with a `response` is *teacher-forced*: the target reads prompt + response in one pass, and its own
  next-token choices there are the labels (prefill speed);
- a record with a `prompt` only is *self-distilled*: the target writes the answer. Every `follow_up_every`-th such
  record also gets a second user turn (FOLLOW_UPS) after the target's answer, answered by the target again, so
  that the head sees multi-turn chat.

The extraction order interleaves the files by weight (a file of weight 3 gives three records for each one of a
file of weight 1, until it runs out), and within a file it takes the record families (the `source` up to its
first ':') in turn, each family's records shuffled with a fixed seed. Any prefix of the order is therefore a
mix in the stated proportions, so extraction can stop anywhere and resume, and more can be extracted later.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

SHARED_DATA = Path("../shared/data")
#: The default mix: chat answers read by teacher forcing; chat, long-document, review, QA and translation prompts
#: answered by the target; maths and Self-Instruct prompts answered by the target.
DEFAULT_MIX = (("train_responses.jsonl", 4.0), ("train_chat.jsonl", 3.0), ("train_prompts.jsonl", 1.0))

FOLLOW_UPS = (
    "Can you make that shorter?",
    "Please explain that in simpler words.",
    "Give me a concrete example.",
    "Rewrite your answer in a more formal tone.",
    "Summarize your answer in one sentence.",
    "What are the limitations of what you just said?",
    "Now turn your answer into a bulleted list.",
    "Why is that? Explain your reasoning step by step.",
    "Can you add more detail to the most important point?",
    "Write a short title for your answer, then restate it in two sentences.",
)


@dataclass(frozen=True)
class DataFile:
    path: Path
    weight: float = 1.0


@dataclass(frozen=True)
class Item:
    """One record to extract. follow_up: a second user turn answered after the target's first answer."""

    source: str
    prompt: str
    response: str | None = None
    follow_up: str | None = None


def parse_data_spec(spec: str) -> DataFile:
    """'FILE' or 'FILE:WEIGHT' (a positive number after the last colon); the file must exist."""
    path, weight = spec, 1.0
    head, sep, tail = spec.rpartition(":")
    if sep and head:
        try:
            weight = float(tail)
            path = head
        except ValueError:
            pass  # a colon inside the path itself
    if not weight > 0 or weight != weight or weight == float("inf"):
        raise ConfigError(f"--data {spec}: the weight must be a positive number")
    if not Path(path).is_file():
        raise ConfigError(f"--data {spec}: file not found: {path}")
    return DataFile(Path(path), weight)


def default_mix(folder: Path = SHARED_DATA) -> list[DataFile]:
    """DEFAULT_MIX's files in `folder`; an error naming the first one missing."""
    files = []
    for name, weight in DEFAULT_MIX:
        if not (folder / name).is_file():
            raise ConfigError(f"the default training mix needs {folder / name}; name your data with --data FILE")
        files.append(DataFile(folder / name, weight))
    return files


def read_items(data: DataFile, follow_up_every: int = 4) -> list[Item]:
    """The file's records in extraction order (families in turn, each shuffled with a fixed seed); a bad line is
    named by its number."""
    by_family: dict[str, list[Item]] = {}
    lines = data.path.read_text(encoding="utf-8").split("\n")  # JSON strings may hold U+2028 and alike
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            prompt, response, source = row["prompt"], row.get("response"), str(row.get("source", ""))
            if not isinstance(prompt, str) or not prompt.strip():
                raise ValueError("'prompt' is not a non-empty string")
            if response is not None and (not isinstance(response, str) or not response.strip()):
                raise ValueError("'response' is not a non-empty string")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{data.path}:{number}: not a training record ({exc})") from None
        by_family.setdefault(source.split(":")[0], []).append(Item(source, prompt, response))
    if not by_family:
        raise ConfigError(f"{data.path} holds no training records")
    for family, items in by_family.items():
        random.Random(_seed(family)).shuffle(items)
    ordered = _take_in_turn(list(by_family.values()))
    out, open_ended = [], 0
    for item in ordered:
        if item.response is None:
            if follow_up_every and open_ended % follow_up_every == follow_up_every - 1:
                item = Item(item.source, item.prompt, None, FOLLOW_UPS[open_ended // follow_up_every % len(FOLLOW_UPS)])
            open_ended += 1
        out.append(item)
    return out


def mix_order(files: list[DataFile], follow_up_every: int = 4, limit: int | None = None) -> list[Item]:
    """Every file's items, interleaved by weight (stride scheduling: next comes the file with the fewest items
    taken per unit of weight), up to `limit` items."""
    lists = [read_items(f, follow_up_every) for f in files]
    taken = [0] * len(files)
    out = []
    limit = sum(map(len, lists)) if limit is None else limit
    while len(out) < limit:
        open_files = [i for i in range(len(files)) if taken[i] < len(lists[i])]
        if not open_files:
            break
        i = min(open_files, key=lambda j: ((taken[j] + 1) / files[j].weight, j))
        out.append(lists[i][taken[i]])
        taken[i] += 1
    return out


def mix_fingerprint(files: list[DataFile], follow_up_every: int) -> str:
    """A short hash of the mix (file contents, weights, follow-up rate): data extracted for one mix is not
    continued with another."""
    digest = hashlib.sha256(str(follow_up_every).encode())
    for f in files:
        digest.update(hashlib.sha256(f.path.read_bytes()).digest())
        digest.update(repr(f.weight).encode())
    return digest.hexdigest()[:12]


def describe(files: list[DataFile]) -> list[dict]:
    return [{"file": str(f.path), "weight": f.weight} for f in files]


def _take_in_turn(groups: list[list[Item]]) -> list[Item]:
    out, depth = [], 0
    while any(depth < len(g) for g in groups):
        out += [g[depth] for g in groups if depth < len(g)]
        depth += 1
    return out


def _seed(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
