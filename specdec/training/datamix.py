"""Training data mixes: which records a drafter learns from, and in what order they are extracted.

A mix is several JSONL files (or folders of them), each with a weight (`--data FILE[:WEIGHT]`). One record a line:
  {"prompt": str, "response": str (optional), "source": str (optional)}
or the request records of a server's traces (`specdec serve --trace DIR`, specdec/trace.py): the prompt and the
output as the target's token ids, read by teacher forcing like a response (the target's own traffic: the best
data a head can learn from).
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
from ..files import read_lines

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
    """One record to extract. follow_up: a second user turn answered after the target's first answer. token_ids:
    a traced request's prompt and output, already tokenized (prompt and response are then unused); the output
    starts at answer_from."""

    source: str
    prompt: str
    response: str | None = None
    follow_up: str | None = None
    token_ids: tuple[int, ...] | None = None
    answer_from: int = 0


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
    if not Path(path).is_file() and not Path(path).is_dir():
        raise ConfigError(f"--data {spec}: file not found: {path}")
    if Path(path).is_dir() and not _files(Path(path)):
        raise ConfigError(f"--data {spec}: the folder holds no .jsonl files")
    return DataFile(Path(path), weight)


def _files(path: Path) -> list[Path]:
    """The JSONL files of a --data path: the file itself, or a folder's .jsonl files in name order."""
    return sorted(path.glob("*.jsonl")) if path.is_dir() else [path]


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
    for path in _files(data.path):
        model = None  # a trace's target, from its header
        lines = read_lines(path)
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                if row.get("type") == "header":
                    model = row.get("model", model)
                    continue
                item = _item(row, model)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{path}:{number}: not a training record ({exc})") from None
            by_family.setdefault(source_family(item.source), []).append(item)
    if not by_family:
        raise ConfigError(f"{data.path} holds no training records")
    for family, items in by_family.items():
        random.Random(_seed(family)).shuffle(items)
    ordered = _take_in_turn(list(by_family.values()))
    out, open_ended = [], 0
    for item in ordered:
        if item.response is None and item.token_ids is None:
            if follow_up_every and open_ended % follow_up_every == follow_up_every - 1:
                item = Item(item.source, item.prompt, None, FOLLOW_UPS[open_ended // follow_up_every % len(FOLLOW_UPS)])
            open_ended += 1
        out.append(item)
    return out


def _item(row: dict, model: str | None) -> Item:
    """A training record, or a trace's request record, its source naming the traced model ("trace:MODEL", from
    the trace's header)."""
    if row.get("type") == "request":
        prompt, output = row["prompt_ids"], row["output_ids"]
        if not all(isinstance(t, int) and t >= 0 for t in prompt + output) or not prompt or not output:
            raise ValueError("a trace record needs non-empty 'prompt_ids' and 'output_ids' of token ids")
        if model is None:
            raise ValueError("a trace record before the trace's header")
        return Item(f"trace:{model}", "", token_ids=tuple(prompt + output), answer_from=len(prompt))
    prompt, response, source = row["prompt"], row.get("response"), str(row.get("source", ""))
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError("'prompt' is not a non-empty string")
    if response is not None and (not isinstance(response, str) or not response.strip()):
        raise ValueError("'response' is not a non-empty string")
    return Item(source, prompt, response)


def mix_order(files: list[DataFile], follow_up_every: int = 4, limit: int | None = None) -> list[Item]:
    """Every file's items, interleaved by weight (stride scheduling: next comes the file with the fewest items
    taken per unit of weight), up to `limit` items."""
    lists = [read_items(f, follow_up_every) for f in files]
    taken = [0] * len(files)
    out: list[Item] = []
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
        for path in _files(f.path):
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        digest.update(repr(f.weight).encode())
    return digest.hexdigest()[:12]


def source_family(source: str) -> str:
    """A record's family: its source up to the first ':' ("t0:xsum_..." -> "t0"; a second turn's family keeps its
    "+turn2")."""
    return source.split(":")[0]


def _in_family(family: str, name: str) -> bool:
    """Whether a sequence of `family` belongs to the family `name` (its second turns, FAMILY+turn2, too)."""
    return family == name or family.startswith(name + "+")


def _check_families(sequences: list[dict], names, option: str) -> None:
    """Refuses a family the data does not hold, so a misspelt name does not silently do nothing."""
    present = {source_family(s["source"]) for s in sequences}
    unknown = [name for name in names if not any(_in_family(family, name) for family in present)]
    if unknown:
        raise ConfigError(
            f"{option} {', '.join(unknown)}: no such source family in the data (it holds {', '.join(sorted(present))})"
        )


def without_families(sequences: list[dict], families: list[str]) -> list[dict]:
    """The sequences whose family is none of `families`; a family also drops its second turns (FAMILY+turn2). An
    unknown family is refused."""
    if not families:
        return sequences
    _check_families(sequences, families, "--exclude-source")
    return [s for s in sequences if not any(_in_family(source_family(s["source"]), name) for name in families)]


def parse_repeats(specs: list[str]) -> dict[str, int]:
    """`--repeat-source FAMILY:N` options -> {family: N}, N a whole number >= 1."""
    repeats: dict[str, int] = {}
    for spec in specs:
        name, sep, count = spec.rpartition(":")
        if not sep or not name or not count.isdigit() or int(count) < 1:
            raise ConfigError(f"--repeat-source {spec!r}: expected FAMILY:N with N a whole number >= 1")
        if name in repeats:
            raise ConfigError(
                f"--repeat-source {spec!r}: {name!r} is already repeated {repeats[name]} times; give each family once"
            )
        repeats[name] = int(count)
    return repeats


def repeat_families(sequences: list[dict], repeats: dict[str, int]) -> list[dict]:
    """The sequences, each of a family in `repeats` (and its second turns) N times: a training epoch then sees that
    family N times as often, as if the mix had weighted it so (an unknown family is refused)."""
    if not repeats:
        return sequences
    _check_families(sequences, repeats, "--repeat-source")
    out = []
    for s in sequences:
        family = source_family(s["source"])
        out += [s] * max((n for name, n in repeats.items() if _in_family(family, name)), default=1)
    return out


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
