"""Extracts a drafter's training data from the target: its features and choices at every position of a mix.

Teacher-forced items (prompt + response) take one prefill pass each, batched by length; self-distilled items
(prompt only) are answered by the target in batched plain decoding, and those with a follow-up get a second
turn. Items are processed in blocks of the mix order (datamix.mix_order); each block becomes one shard, written
atomically, so extraction stops anywhere and resumes at the first block not recorded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from ..models.backend import check_feature_layers
from .datamix import Item
from .shards import ShardWriter
from .teacher import decode_batch, teacher_forced


class Extractor:
    """Turns items into stored sequences for one target. max_len: longest sequence kept (prompts that leave no
    room for an answer are skipped, responses are cut). feature_layers: also store the inputs of these layers."""

    def __init__(
        self,
        target,
        max_new_tokens: int = 256,
        batch_size: int = 16,
        batch_tokens: int = 4096,
        temperature: float = 0.0,
        max_len: int = 2048,
        feature_layers: tuple[int, ...] = (),
    ):
        from ..engine import SpecDecoder

        self.target, self.backend = target, target.backend
        self.encoder = SpecDecoder(target, None)
        self.max_new_tokens, self.batch_size, self.batch_tokens = max_new_tokens, batch_size, batch_tokens
        self.temperature, self.max_len = temperature, max_len
        self.eos = target.info.eos_token_ids
        self.feature_layers = tuple(feature_layers)
        self.skipped = 0

    def run(self, items: list[Item], writer: ShardWriter, block: int = 64, progress: bool = True) -> dict:
        from tqdm.auto import tqdm

        H = self.target.info.hidden_size
        bar = tqdm(
            total=len(items),
            initial=min(writer.done, len(items)),
            desc="extracting",
            unit="item",
            disable=not progress,
            file=sys.stderr,
        )
        t0 = time.time()
        for first in range(writer.done, len(items), block):
            chunk = items[first : first + block]
            for source, tokens, hidden, labels, ids, values, answer_from in self._block(chunk, first):
                trainable = torch.arange(len(tokens) - 1) >= answer_from - 1
                writer.add(
                    tokens,
                    hidden[:, :H],
                    labels,
                    trainable,
                    ids,
                    values,
                    source,
                    hidden[:, H:] if hidden.shape[1] > H else None,
                )
            writer.flush(first + len(chunk))
            bar.update(len(chunk))
        bar.close()
        shards = writer.index["shards"]
        return {
            "done": writer.done,
            "sequences": sum(s["sequences"] for s in shards),
            "tokens": sum(s["tokens"] for s in shards),
            "trained_tokens": sum(s.get("trained_tokens", 0) for s in shards),
            "seconds": time.time() - t0,
            "skipped": self.skipped,
        }

    def _block(self, chunk: list[Item], first: int):
        """Yields (source, tokens, hidden, labels, topk_ids, topk_logprobs, answer_from) per stored sequence;
        answer_from: the first token position the head learns to predict."""
        forced, open_ended = [], []
        for offset, item in enumerate(chunk):
            if item.token_ids is not None:  # a traced request: the target's own prompt and output
                tokens = list(item.token_ids)[: self.max_len]
                if item.answer_from + 1 < len(tokens):
                    forced.append((item, tokens, item.answer_from))
                else:
                    self.skipped += 1
                continue
            prompt = self.encoder.encode(item.prompt)
            if item.response is not None:
                answer = self.target.tokenizer(item.response, add_special_tokens=False)["input_ids"]
                tokens = (prompt + answer + [self.eos[0]])[: self.max_len]
                if len(prompt) + 1 < len(tokens):
                    forced.append((item, tokens, len(prompt)))
                    continue
            elif len(prompt) + self.max_new_tokens <= self.max_len:
                open_ended.append((item, prompt, first + offset))
                continue
            self.skipped += 1
        for group in self._by_length(forced, lambda f: len(f[1])):
            for (item, tokens, answer_from), out in zip(
                group, teacher_forced(self.backend, [g[1] for g in group], self.feature_layers)
            ):
                yield (item.source, tokens, *out, answer_from)
        follow = []
        for group in self._by_length(open_ended, lambda o: len(o[1]), tokens=None):
            answers = self._answer(group)
            for (item, prompt, seed), (tokens, *out) in zip(group, answers):
                yield (item.source, tokens, *out, len(prompt))
                if item.follow_up:
                    follow.append((item, self._second_turn(item, tokens[len(prompt) :]), seed))
        follow = [f for f in follow if len(f[1]) + self.max_new_tokens <= self.max_len]
        for group in self._by_length(follow, lambda f: len(f[1]), tokens=None):
            answers = self._answer(group)
            for (item, prompt, _), (tokens, *out) in zip(group, answers):
                yield (item.source + "+turn2", tokens, *out, len(prompt))

    def _answer(self, group: list[tuple]):
        """The target's answers to a group of (item, prompt tokens, seed), decoded together (decode_batch)."""
        return decode_batch(
            self.backend,
            [g[1] for g in group],
            self.max_new_tokens,
            self.eos,
            self.temperature,
            seeds=[g[2] for g in group],
            prefill_tokens=self.batch_tokens,
            feature_layers=self.feature_layers,
        )

    def _second_turn(self, item: Item, answer: list[int]) -> list[int]:
        text = self.target.tokenizer.decode([t for t in answer if t not in self.eos], skip_special_tokens=True)
        return self.encoder.encode(
            [
                {"role": "user", "content": item.prompt},
                {"role": "assistant", "content": text.strip()},
                {"role": "user", "content": item.follow_up},
            ]
        )

    def _by_length(self, entries: list, length, tokens: int | None = -1) -> list[list]:
        """Batches of similar length: at most batch_size entries and (unless tokens is None) about batch_tokens
        padded tokens."""
        budget = self.batch_tokens if tokens == -1 else tokens or float("inf")
        batches: list[list] = []
        current: list = []
        for entry in sorted(entries, key=length):
            if current and (len(current) >= self.batch_size or length(entry) * (len(current) + 1) > budget):
                batches.append(current)
                current = []
            current.append(entry)
        return batches + [current] if current else batches


def data_meta(
    target, max_new_tokens: int, temperature: float, extra: dict | None = None, feature_layers: tuple[int, ...] = ()
) -> dict:
    """The settings a data folder is made with (a later run must match them to continue it)."""
    info = target.info
    meta = {
        "target": target.name,
        "vocab_size": info.vocab_size,
        "hidden_size": info.hidden_size,
        "max_new_tokens": max_new_tokens,
        "feature_layers": list(feature_layers),
    }
    if temperature > 0:
        meta["temperature"] = temperature
    meta.update(extra or {})
    return meta


@torch.inference_mode()
def generate_training_data(
    target,
    prompts: list[str],
    folder: Path,
    max_new_tokens: int = 256,
    batch_size: int = 16,
    temperature: float = 0.0,
    progress: bool = True,
    extra_meta: dict | None = None,
    feature_layers: tuple[int, ...] = (),
) -> dict:
    """The target's answers to `prompts` (greedy, or sampled at `temperature`), with its features and choices
    at every position; resumes where it stopped. feature_layers: also store the inputs of these layers."""
    layers = check_feature_layers(tuple(feature_layers), target.info.num_layers)
    writer = ShardWriter(Path(folder), data_meta(target, max_new_tokens, temperature, extra_meta, layers))
    extractor = Extractor(target, max_new_tokens, batch_size, temperature=temperature, feature_layers=layers)
    return extractor.run([Item("prompts", p) for p in prompts], writer, block=batch_size, progress=progress)
