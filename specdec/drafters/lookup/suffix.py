"""Suffix drafting: continue the context the way earlier text continued its longest matching suffix.

Two indexes of the same kind are searched: one over the current request (prompt and tokens so far),
and one shared by every request this drafter and its forks serve, fed with each finished output (as
in SuffixDecoding, Arctic/vLLM `suffix`). Repeated work (agents calling the same tools, templated
answers, a question asked again) is drafted from what the target itself wrote before, or from the
user's own texts (`specdec suffix-index build`). Deterministic (q one-hot); costs microseconds per token.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import sys
import time
from collections import deque
from pathlib import Path

import torch

from ...errors import ConfigError
from ..base import Budget, Draft, Drafter, DraftRequest

INDEX_FORMAT = "specdec-suffix-index/1"
SAVE_EVERY_S = 30.0  # a file-backed index is written at most this often while serving, and at exit


def tokenizer_id(tokenizer) -> str:
    """A digest of the tokenizer's token -> id map ("" for None): index files are shared only where it is equal."""
    if tokenizer is None:
        return ""
    vocab = json.dumps(sorted(tokenizer.get_vocab().items()), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(vocab.encode("utf-8")).hexdigest()[:16]


def read_index_file(path: Path) -> tuple[dict[str, str], list[list[int]]]:
    """(metadata, stored sequences) of an index file (`SuffixIndex.save`); a file that is not one is refused."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tokens, lengths = f.get_tensor("tokens").tolist(), f.get_tensor("lengths").tolist()
    except Exception as exc:  # not safetensors, or not ours
        raise ConfigError(f"could not read suffix index {path}: {exc}") from None
    if meta.get("format") != INDEX_FORMAT or not str(meta.get("vocab_size", "")).isdigit():
        raise ConfigError(
            f"suffix index {path} was not written by specdec (format {meta.get('format')!r}, "
            f"vocabulary {meta.get('vocab_size')})"
        )
    sequences, start = [], 0
    for n in lengths:
        sequences.append(tokens[start : start + n])
        start += n
    return meta, sequences


class SuffixIndex:
    """For every run of 1..max_n tokens in the stored sequences, how often each token followed it.

    Runs are keyed by their hash (a collision could only cost a rejected draft); a run with one continuation
    so far holds it packed in one int (token << 32 | count), one with several a dict {token: count}.
    Bounded: past `max_tokens` stored tokens, the oldest sequences are forgotten.
    """

    def __init__(self, max_n: int = 8, max_tokens: int = 200_000):
        self.max_n, self.max_tokens = max_n, max_tokens
        self.next_counts: dict[int, int | dict[int, int]] = {}
        self.sequences: deque[list[int]] = deque()
        self.tokens = 0
        self.path: Path | None = None  # set by load(): a file the index is kept in
        self.vocab_size, self.saved_at = 0, 0.0
        self.write_error: str | None = None  # why the last write of the file failed, if it did
        self.tokenizer, self.model = "", ""  # tokenizer_id() and model name the file is written with

    # ---- a file of past outputs (safetensors: the stored sequences, concatenated) ------------------
    @classmethod
    def open(
        cls, path: str | os.PathLike, vocab_size: int, max_n: int = 8, tokenizer: str = "", model: str = ""
    ) -> "SuffixIndex":
        """The index kept in `path` (see load), written back at most every SAVE_EVERY_S seconds as outputs
        arrive (`learned`) and at exit."""
        index = cls.load(path, vocab_size, max_n, tokenizer, model)
        index.saved_at = float("-inf")  # the first output is written
        atexit.register(index._save_at_exit)
        return index

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        vocab_size: int,
        max_n: int = 8,
        tokenizer: str = "",
        model: str = "",
        keep: bool = True,
    ) -> "SuffixIndex":
        """The index in `path`, empty when the file does not exist (or keep is False: then the file is only
        checked). Refuses a file written for another vocabulary size, or for another tokenizer (`tokenizer_id`)
        where both the file and the caller name one."""
        path = Path(path)
        if not path.parent.is_dir():
            raise ConfigError(f"suffix index {path}: folder {path.parent} does not exist")
        index = cls(max_n)
        index.path, index.vocab_size, index.tokenizer, index.model = path, vocab_size, tokenizer, model
        if path.exists():
            meta, sequences = read_index_file(path)
            if meta.get("vocab_size") != str(vocab_size):
                raise ConfigError(
                    f"suffix index {path} was not written by specdec for a vocabulary of {vocab_size} "
                    f"tokens (format {meta.get('format')!r}, vocabulary {meta.get('vocab_size')})"
                )
            if tokenizer and meta.get("tokenizer", tokenizer) != tokenizer:
                owner = f"for model {meta['model']}, whose tokenizer" if meta.get("model") else "for a tokenizer that"
                raise ConfigError(f"suffix index {path} was written {owner} is not {model or 'this model'}'s")
            for sequence in sequences if keep else ():
                index.store(sequence)
        return index

    def _save_at_exit(self) -> None:
        try:
            self.save()
        except Exception as exc:  # the process is ending: say so, do not raise
            print(f"specdec: could not write suffix index {self.path}: {exc}", file=sys.stderr)

    def learned(self) -> None:
        """Writes a file-backed index when the last write is old enough. A write that fails (a full disk) is said
        once on stderr and tried again later: the index in memory and the requests that feed it go on, and the file
        keeps its last whole version."""
        if self.path is not None and time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            try:
                self.save()
                self.write_error = None
            except OSError as exc:
                self.saved_at = time.monotonic()  # the next try after SAVE_EVERY_S
                if self.write_error is None:
                    print(
                        f"specdec: could not write suffix index {self.path} ({exc}); drafting goes on from "
                        f"memory, the write is tried again every {SAVE_EVERY_S:g} s",
                        file=sys.stderr,
                    )
                self.write_error = str(exc)

    def save(self) -> None:
        """Writes the stored sequences to the index's file (atomically)."""
        from safetensors.torch import save_file

        if self.path is None:
            return
        from ...files import write_atomic

        tokens = [t for sequence in self.sequences for t in sequence]
        tensors = {
            "tokens": torch.tensor(tokens, dtype=torch.int32),
            "lengths": torch.tensor([len(s) for s in self.sequences], dtype=torch.int64),
        }
        metadata = {
            "format": INDEX_FORMAT,
            "vocab_size": str(self.vocab_size),
            "max_n": str(self.max_n),
            **({"tokenizer": self.tokenizer} if self.tokenizer else {}),
            **({"model": self.model} if self.model else {}),
        }
        write_atomic(self.path, lambda tmp: save_file(tensors, str(tmp), metadata=metadata))
        self.saved_at = time.monotonic()

    # ---- counting ---------------------------------------------------------------------------------
    def add(self, sequence: list[int], start: int = 0) -> None:
        """Counts the tokens of `sequence` from position `start` on (those before it were counted already)."""
        for i in range(max(start, 1), len(sequence)):
            self._count(sequence, i, +1)

    def store(self, sequence: list[int]) -> None:
        """Adds a whole sequence, forgetting the oldest ones beyond the size bound."""
        if len(sequence) < 2:
            return
        sequence = list(sequence)
        self.add(sequence)
        self.sequences.append(sequence)
        self.tokens += len(sequence)
        while self.tokens > self.max_tokens and len(self.sequences) > 1:
            old = self.sequences.popleft()
            self.tokens -= len(old)
            for i in range(1, len(old)):
                self._count(old, i, -1)

    def store_all(self, sequences: list[list[int]]) -> None:
        """store() of each sequence in turn, without counting those the size bound would forget by the last one:
        either way, what is kept is the longest run of newest sequences within max_tokens (or the newest alone)."""
        sequences = [s for s in sequences if len(s) >= 2]
        first, total = len(sequences), 0
        while first > 0 and (first == len(sequences) or total + len(sequences[first - 1]) <= self.max_tokens):
            first -= 1
            total += len(sequences[first])
        if first > 0:  # sequences[first - 1] does not fit with those after it: everything older goes too
            self.next_counts, self.sequences, self.tokens = {}, deque(), 0
        for sequence in sequences[first:]:
            self.store(sequence)

    def continuations(self, run: list[int]) -> dict[int, int]:
        """{token: count} of what followed `run`."""
        found = self.next_counts.get(hash(tuple(run)))
        if found is None:
            return {}
        return dict(found) if isinstance(found, dict) else {found >> 32: found & 0xFFFFFFFF}

    def _count(self, sequence: list[int], i: int, delta: int) -> None:
        token = sequence[i]
        for n in range(1, min(self.max_n, i) + 1):
            key = hash(tuple(sequence[i - n : i]))
            found = self.next_counts.get(key)
            if isinstance(found, dict):
                found[token] = found.get(token, 0) + delta
                if found[token] <= 0:
                    del found[token]
                    if len(found) == 1:
                        ((only, count),) = found.items()
                        self.next_counts[key] = only << 32 | count
            elif found is None or found >> 32 == token:
                count = (found & 0xFFFFFFFF if found is not None else 0) + delta
                if count > 0:
                    self.next_counts[key] = token << 32 | count
                elif found is not None:
                    del self.next_counts[key]
            elif delta > 0:
                self.next_counts[key] = {found >> 32: found & 0xFFFFFFFF, token: delta}

    def next_token(self, context: list[int], min_n: int) -> tuple[int, int, float] | None:
        """(token, match length, share of the matches it followed) for the longest suffix of `context` seen
        before (at least min_n tokens), its most frequent continuation; None without a match."""
        for n in range(min(self.max_n, len(context)), min_n - 1, -1):
            found = self.next_counts.get(hash(tuple(context[-n:])))
            if found is None:
                continue
            if not isinstance(found, dict):
                return found >> 32, n, 1.0
            token = max(found, key=lambda t: found[t])
            return token, n, found[token] / sum(found.values())
        return None


class SuffixDrafter(Drafter):
    """Drafts from the request's own text and from past outputs, whichever matches the longer suffix."""

    name = "suffix"

    def __init__(self, min_n: int = 2, max_n: int = 8, min_probability: float = 0.1, shared: SuffixIndex | None = None):
        """min_probability: drafting stops where the product of the continuation shares falls below it."""
        if not (1 <= min_n <= max_n <= 32):
            raise ConfigError(f"suffix sizes must satisfy 1 <= min_n <= max_n <= 32, got min_n={min_n}, max_n={max_n}")
        if not 0.0 <= min_probability < 1.0:
            raise ConfigError(f"suffix min_probability must be in [0, 1), got {min_probability}")
        self.min_n, self.max_n, self.min_probability = min_n, max_n, min_probability
        self.shared = shared if shared is not None else SuffixIndex(max_n)
        self.local = SuffixIndex(max_n)
        self.indexed = 0  # tokens of the current request in self.local

    def fork(self) -> "SuffixDrafter":
        return SuffixDrafter(self.min_n, self.max_n, self.min_probability, shared=self.shared)

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self.local, self.indexed = SuffixIndex(self.max_n), 0

    def learn(self, output: list[int]) -> None:
        self.shared.store(output)
        self.shared.learned()

    def propose(self, context: list[int], budget: Budget) -> Draft:
        self.local.add(context, self.indexed)
        self.indexed = len(context)
        work, tokens, reach = list(context[-self.max_n :]), [], 1.0
        for _ in range(budget.k):
            hits = [h for h in (self.local.next_token(work, self.min_n), self.shared.next_token(work, self.min_n)) if h]
            if not hits:
                break
            token, _, share = max(hits, key=lambda h: (h[1], h[2]))  # the longer match, then the surer one
            reach *= share
            if reach < self.min_probability:
                break
            tokens.append(token)
            work = (work + [token])[-self.max_n :]
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long))
