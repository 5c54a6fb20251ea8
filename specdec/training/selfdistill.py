"""Self-distillation data: the target answers training prompts; its features and choices are recorded.

For each sequence x_0..x_{L-1} (chat-templated prompt, then the target's greedy answer) a shard stores
  tokens   (L,)      int32
  features (L-1, H)  bfloat16  f_t: the target's final hidden state at position t (its LM head's input); for
                               EAGLE-3 heads (feature_layers) (L-1, A*H): the inputs of those A layers at t
  labels   (L-1,)    int32     argmax of the target's logits at position t: its choice for x_{t+1}
Shards are safetensors files (no pickle) in one folder with an index.json, so a run can stop and resume.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import ConfigError


def interleave_sources(path: str | Path, limit: int | None) -> list[str]:
    """Prompts (JSONL, a `prompt` field) taken round-robin across the file's `source` values, so that a limit
    keeps the mix."""
    from ..bench.prompts import round_robin

    return [prompt for prompt, _ in round_robin(_prompt_rows(path), limit, key=lambda row: row[1])]


class ShardWriter:
    """Appends sequences to numbered shards; index.json records how many prompts are done."""

    def __init__(self, folder: Path, meta: dict, shard_size: int = 64):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.index_path = folder / "index.json"
        self.index = json.loads(self.index_path.read_text()) if self.index_path.exists() else {"shards": [], "done": 0}
        old = {k: self.index.get(k) for k in meta}
        if self.index["shards"] and old != meta:
            raise ConfigError(f"{folder} holds data made with other settings ({old}); use another --data-dir")
        self.index.update(meta)
        self.shard_size = shard_size
        self.pending: list[dict] = []

    @property
    def done(self) -> int:
        return self.index["done"]

    def add(self, tokens: list[int], features: torch.Tensor, labels: list[int]) -> None:
        self.pending.append({"tokens": tokens, "features": features, "labels": labels})

    def flush(self, prompts_done: int) -> None:
        if self.pending:
            name = f"shard_{len(self.index['shards']):05d}.safetensors"
            lengths = torch.tensor([len(p["tokens"]) for p in self.pending])
            save_file({"tokens": torch.tensor([t for p in self.pending for t in p["tokens"]], dtype=torch.int32),
                       "labels": torch.tensor([t for p in self.pending for t in p["labels"]], dtype=torch.int32),
                       "features": torch.cat([p["features"] for p in self.pending]).to(torch.bfloat16).contiguous(),
                       "lengths": lengths.to(torch.int64)}, str(self.folder / name))
            self.index["shards"].append({"file": name, "sequences": len(self.pending),
                                         "tokens": int(lengths.sum())})
            self.pending = []
        self.index["done"] = prompts_done
        self.index_path.write_text(json.dumps(self.index, indent=1))


def read_shards(folder: Path) -> list[dict]:
    """Every stored sequence: {"tokens" (L,), "features" (L-1, H), "labels" (L-1,)}."""
    index = json.loads((folder / "index.json").read_text())
    out = []
    for shard in index["shards"]:
        data = load_file(str(folder / shard["file"]))
        at_t = at_f = 0
        for L in data["lengths"].tolist():
            out.append({"tokens": data["tokens"][at_t:at_t + L].long(), "features": data["features"][at_f:at_f + L - 1],
                        "labels": data["labels"][at_f:at_f + L - 1].long()})
            at_t += L
            at_f += L - 1
    return out


def cycle_sources(path: str | Path, count: int) -> list[str]:
    """`count` prompts taken round-robin across the file's `source` values, each source repeating once it runs
    out, so that every source opens the same share of synthetic prompts however small it is."""
    by_source: dict[str, list[str]] = {}
    for prompt, source in _prompt_rows(path):
        by_source.setdefault(source, []).append(prompt)
    groups = list(by_source.values())
    return [groups[i % len(groups)][(i // len(groups)) % len(groups[i % len(groups)])] for i in range(count)]


def _prompt_rows(path: str | Path) -> list[tuple[str, str]]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training prompt file not found: {path}")
    rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    return [(r["prompt"], r.get("source", "")) for r in rows
            if isinstance(r.get("prompt"), str) and r["prompt"].strip()]


@torch.inference_mode()
def synthesize_prompts(target, openings: list[str], folder: Path, temperature: float = 0.9, max_tokens: int = 96,
                       batch_size: int = 32, progress: bool = True) -> list[str]:
    """Self-Instruct-style prompts written by the target itself: its chat template's user turn opens with the
    first 2-5 words of a training prompt (`openings`, one prompt each) and the target, sampling at
    `temperature`, writes the rest of the turn. Turns that do not end within `max_tokens` are dropped, as are
    repeats. Cached in folder/synthetic_prompts.jsonl, which later runs reuse and extend."""
    from tqdm.auto import tqdm

    tokenizer, backend = target.tokenizer, target.backend
    before, _ = _around_user_turn(tokenizer, "--synthesize", generation_prompt=False)
    folder.mkdir(parents=True, exist_ok=True)
    cache = folder / "synthetic_prompts.jsonl"
    done = [json.loads(l) for l in cache.read_text(encoding="utf-8").splitlines()] if cache.exists() else []
    heads = [" ".join(o.split()[: 2 + i % 4]) for i, o in enumerate(openings)]  # 2-5 opening words
    if any(row["opening"] != h for row, h in zip(done, heads)):
        raise ConfigError(f"{cache} was written from other training prompts; use another --data-dir")
    eos = target.info.eos_token_ids
    bar = tqdm(total=len(openings), initial=len(done), desc="synthetic prompts", unit="prompt", disable=not progress,
               file=sys.stderr)
    for first in range(len(done), len(openings), batch_size):
        chunk = heads[first:first + batch_size]
        ids = [tokenizer(before + h, add_special_tokens=False)["input_ids"] for h in chunk]
        answers = _decode_batch(backend, ids, max_tokens, eos, temperature, seeds=range(first, first + len(ids)),
                                keep_features=False)
        rows = []
        for opening, prefix, (tokens, _, _) in zip(chunk, ids, answers):
            ended = tokens[-1] in eos
            text = opening + tokenizer.decode(tokens[len(prefix):-1 if ended else None], skip_special_tokens=True)
            rows.append({"opening": opening, "prompt": text.strip(), "ended": ended})
        with cache.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        done += rows
        bar.update(len(rows))
    bar.close()
    seen, out = set(), []
    for row in done[: len(openings)]:
        if row["ended"] and len(row["prompt"]) > len(row["opening"]) + 8 and row["prompt"] not in seen:
            seen.add(row["prompt"])
            out.append(row["prompt"])
    return out


DOCUMENT_TASKS = (
    "Summarize the following text in a few sentences.\n\n{doc}",
    "Read the passage and answer the question.\n\nPassage:\n{doc}\n\nQuestion: What is the main point of the passage?",
    "List the key facts, names and numbers in this text.\n\n{doc}",
    "Write a one-paragraph summary of this article:\n{doc}",
    "Based only on the passage below, what does it conclude or recommend?\n\n{doc}",
    "Rewrite the following text in simpler words.\n\n{doc}",
    "Extract the main points of the text below as a bulleted list.\n\n{doc}",
    "Give the text below a title, then summarize it in two sentences.\n\n{doc}",
)


def document_prompts(sequences: list[dict], tokenizer, count: int, min_tokens: int = 64) -> list[str]:
    """`count` prompts asking about texts the target wrote itself: its answers in self-distilled `sequences`
    (at least `min_tokens` long) wrapped in summary, question, extraction and rewriting tasks (DOCUMENT_TASKS,
    in turn). They give the head the long-context work (RAG, summaries) the prompt file lacks; a text serves
    again, under the next task, once every text has served."""
    _, answer_start = _around_user_turn(tokenizer, "--document-tasks", generation_prompt=True)  # opens the reply
    documents, seen = [], set()
    for seq in sequences:
        text = tokenizer.decode(seq["tokens"].tolist(), skip_special_tokens=False)
        at = text.rfind(answer_start)
        if at < 0:
            continue
        answer = tokenizer.decode(tokenizer(text[at + len(answer_start):], add_special_tokens=False)["input_ids"],
                                  skip_special_tokens=True).strip()
        if len(tokenizer(answer, add_special_tokens=False)["input_ids"]) >= min_tokens and answer not in seen:
            seen.add(answer)
            documents.append(answer)
    if not documents:
        raise ConfigError(f"no answer of {min_tokens} tokens or more in the data to build document tasks from")
    n = len(documents)
    return [DOCUMENT_TASKS[(i + i // n) % len(DOCUMENT_TASKS)].format(doc=documents[i % n]) for i in range(count)]


def _around_user_turn(tokenizer, option: str, generation_prompt: bool) -> tuple[str, str]:
    """The chat template's text before and after a user turn's content (after: up to the assistant's turn
    opening when generation_prompt); `option` names what needs a template, for the error."""
    if not tokenizer.chat_template:
        raise ConfigError(f"{option} needs a model with a chat template")
    marker = "\x00SPECDEC\x00"
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": marker}],
                                             add_generation_prompt=generation_prompt, tokenize=False)
    at = rendered.index(marker)
    return rendered[:at], rendered[at + len(marker):]


def read_data(folders: list[Path], target, feature_layers: tuple[int, ...] = ()) -> list[dict]:
    """The sequences of several data folders, each checked to come from this target and to hold the features of
    `feature_layers` (empty: the final hidden state)."""
    out = []
    for folder in folders:
        index_path = folder / "index.json"
        if not index_path.is_file():
            raise ConfigError(f"{folder} holds no self-distilled data (index.json)")
        index = json.loads(index_path.read_text())
        if (index.get("target"), index.get("hidden_size")) != (target.name, target.info.hidden_size):
            raise ConfigError(f"{folder} holds data from target {index.get('target')!r}, not {target.name!r}")
        held = tuple(index.get("feature_layers", ()))
        if held != tuple(feature_layers):
            raise ConfigError(f"{folder} holds the features of layers {list(held) or 'final'}, not of "
                              f"{list(feature_layers) or 'final'} (EAGLE-3 heads and others need their own data)")
        out += read_shards(folder)
    return out


@torch.inference_mode()
def generate_training_data(target, prompts: list[str], folder: Path, max_new_tokens: int = 256, batch_size: int = 16,
                           temperature: float = 0.0, progress: bool = True, extra_meta: dict | None = None,
                           feature_layers: tuple[int, ...] = ()) -> dict:
    """The target's answers to `prompts` (greedy, or sampled at `temperature`), with its features and greedy
    choices at every position; resumes where it stopped. extra_meta: more settings the cached data must match.
    feature_layers: store the inputs of these layers (EAGLE-3) instead of the final hidden state."""
    from tqdm.auto import tqdm

    from ..engine import SpecDecoder

    backend, info = target.backend, target.info
    meta = {"target": target.name, "vocab_size": info.vocab_size, "hidden_size": info.hidden_size,
            "max_new_tokens": max_new_tokens}
    if temperature > 0:
        meta["temperature"] = temperature
    if feature_layers:
        meta["feature_layers"] = list(feature_layers)
    columns = backend.add_feature_layers(tuple(feature_layers))
    meta.update(extra_meta or {})
    writer = ShardWriter(folder, meta)
    encoder = SpecDecoder(target, None)
    start = writer.done
    bar = tqdm(total=len(prompts), initial=start, desc="self-distillation", unit="prompt", disable=not progress,
               file=sys.stderr)
    t0 = time.time()
    for first in range(start, len(prompts), batch_size):
        chunk = [encoder.encode(p) for p in prompts[first:first + batch_size]]
        for tokens, features, labels in _decode_batch(backend, chunk, max_new_tokens, info.eos_token_ids,
                                                      temperature, seeds=range(first, first + len(chunk))):
            writer.add(tokens, features[:, columns], labels)
        writer.flush(min(first + batch_size, len(prompts)))
        bar.update(len(chunk))
    bar.close()
    total = sum(s["tokens"] for s in writer.index["shards"])
    return {"sequences": sum(s["sequences"] for s in writer.index["shards"]), "tokens": total,
            "seconds": time.time() - t0}


def _decode_batch(backend, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...],
                  temperature: float = 0.0, seeds=None, keep_features: bool = True):
    """Plain batched decoding that keeps every position's feature (H,) and argmax. The next token is the argmax
    (temperature 0) or drawn from softmax(logits / temperature) with one generator per sequence (`seeds`, ints).
    Yields (tokens, features (L-1, H) or None, labels) per prompt."""
    generators = [torch.Generator().manual_seed(s) for s in (seeds or range(len(prompts)))]

    def choose(i: int, logits: torch.Tensor) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, -1)
        return int(torch.multinomial(probs, 1, generator=generators[i]))

    caches = [backend.new_cache() for _ in prompts]
    try:
        outs = backend.forward_batch(caches, [torch.tensor(p) for p in prompts], output_hidden=keep_features)
        tokens = [list(p) for p in prompts]
        feats = [[o.hidden.float()] if keep_features else [] for o in outs]
        labels = [o.logits.float().argmax(-1).tolist() for o in outs]
        for i, o in enumerate(outs):
            tokens[i].append(choose(i, o.logits[-1]))
        steps = 1
        live = [i for i in range(len(prompts)) if tokens[i][-1] not in eos]
        while live and steps < max_new_tokens:
            outs = backend.forward_batch([caches[i] for i in live], [torch.tensor(tokens[i][-1:]) for i in live],
                                         output_hidden=keep_features)
            for i, o in zip(live, outs):
                if keep_features:
                    feats[i].append(o.hidden.float())
                labels[i].append(int(o.logits[0].float().argmax()))
                tokens[i].append(choose(i, o.logits[0]))
            steps += 1
            live = [i for i in live if tokens[i][-1] not in eos]
        for i in range(len(prompts)):
            yield tokens[i], torch.cat(feats[i]) if keep_features else None, labels[i]
    finally:
        for c in caches:
            backend.release(c)
