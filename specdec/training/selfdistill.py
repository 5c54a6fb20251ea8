"""Self-distillation data: the target answers training prompts; its features and choices are recorded.

For each sequence x_0..x_{L-1} (chat-templated prompt, then the target's greedy answer) a shard stores
  tokens   (L,)      int32
  features (L-1, H)  bfloat16  f_t: the target's final hidden state at position t (its LM head's input)
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

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"training prompt file not found: {path}")
    rows = [json.loads(l) for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    rows = [r for r in rows if isinstance(r.get("prompt"), str) and r["prompt"].strip()]
    return [r["prompt"] for r in round_robin(rows, limit, key=lambda r: r.get("source", ""))]


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


@torch.inference_mode()
def generate_training_data(target, prompts: list[str], folder: Path, max_new_tokens: int = 256, batch_size: int = 16,
                           progress: bool = True) -> dict:
    """Greedy answers of the target to `prompts`, with features and labels; resumes where it stopped."""
    from tqdm.auto import tqdm

    from ..engine import SpecDecoder

    backend, info = target.backend, target.info
    meta = {"target": target.name, "vocab_size": info.vocab_size, "hidden_size": info.hidden_size,
            "max_new_tokens": max_new_tokens}
    writer = ShardWriter(folder, meta)
    encoder = SpecDecoder(target, None)
    start = writer.done
    bar = tqdm(total=len(prompts), initial=start, desc="self-distillation", unit="prompt", disable=not progress,
               file=sys.stderr)
    t0 = time.time()
    for first in range(start, len(prompts), batch_size):
        chunk = [encoder.encode(p) for p in prompts[first:first + batch_size]]
        for tokens, features, labels in _greedy_batch(backend, chunk, max_new_tokens, info.eos_token_ids):
            writer.add(tokens, features, labels)
        writer.flush(min(first + batch_size, len(prompts)))
        bar.update(len(chunk))
    bar.close()
    total = sum(s["tokens"] for s in writer.index["shards"])
    return {"sequences": sum(s["sequences"] for s in writer.index["shards"]), "tokens": total,
            "seconds": time.time() - t0}


def _greedy_batch(backend, prompts: list[list[int]], max_new_tokens: int, eos: tuple[int, ...]):
    """Plain batched greedy decoding that keeps every position's feature and argmax."""
    caches = [backend.new_cache() for _ in prompts]
    try:
        outs = backend.forward_batch(caches, [torch.tensor(p) for p in prompts], output_hidden=True)
        tokens = [list(p) for p in prompts]
        feats = [[o.hidden.float()] for o in outs]
        labels = [o.logits.float().argmax(-1).tolist() for o in outs]
        live = [i for i in range(len(prompts))]
        for i in live:
            tokens[i].append(labels[i][-1])
        steps = 1
        live = [i for i in live if tokens[i][-1] not in eos]
        while live and steps < max_new_tokens:
            outs = backend.forward_batch([caches[i] for i in live], [torch.tensor(tokens[i][-1:]) for i in live],
                                         output_hidden=True)
            for i, o in zip(live, outs):
                choice = int(o.logits[0].float().argmax())
                feats[i].append(o.hidden.float())
                labels[i].append(choice)
                tokens[i].append(choice)
            steps += 1
            live = [i for i in live if tokens[i][-1] not in eos]
        for i in range(len(prompts)):
            yield tokens[i], torch.cat(feats[i]), labels[i]
    finally:
        for c in caches:
            backend.release(c)
