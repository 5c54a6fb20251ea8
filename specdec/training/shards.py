"""The training data's files: the target's features and choices, in safetensors shards (no pickle).

For S sequences of lengths L_i (N = sum L_i tokens, M = N - S scored positions) a shard holds
  tokens          (N,)      int32     the sequences, one after another
  lengths         (S,)      int64
  sources         (S,)      int32     index into index.json's "sources"
  labels          (M,)      int32     argmax of the target's logits at position t: its choice for x_{t+1}
  features        (M, H)    bfloat16  f_t: the target's final hidden state (its LM head's input)
  layer_features  (M, A*H)  bfloat16  the inputs of index.json's "feature_layers" at t (EAGLE-3), if any
  trainable       (M,)      uint8     1 where x_{t+1} belongs to an answer the head should learn
  topk_ids        (M, K)    int32     the target's K most probable next tokens at t, most probable first
  topk_logprobs   (M, K)    float16   their log-probabilities
index.json lists the shards, how many of the mix's items are done, and the settings the data was made with.
Every file is written under a temporary name and then renamed, so an interrupted write never leaves a file that
is read back half-written: a shard that index.json does not list is ignored and written again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import ConfigError
from ..files import write_atomic, write_text_atomic

FORMAT = 2
TOPK = 8


class ShardWriter:
    """Appends sequences to numbered shards; index.json records how many items are done."""

    def __init__(self, folder: Path, meta: dict):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.index_path = folder / "index.json"
        fresh = {
            "format": FORMAT,
            "shards": [],
            "done": 0,
            "sources": [],
            "tokens_by_source": {},
            "trained_tokens_by_source": {},
        }
        self.index: dict[str, Any] = json.loads(self.index_path.read_text()) if self.index_path.exists() else fresh
        if self.index.get("format") != FORMAT:
            raise ConfigError(f"{folder} holds training data in an older format; use another --data-dir")
        old = {k: self.index.get(k) for k in meta}
        if self.index["shards"] and old != meta:
            raise ConfigError(f"{folder} holds data made with other settings ({old}); use another --data-dir")
        self.index.update(meta)
        self.pending: list[dict] = []

    @property
    def done(self) -> int:
        return self.index["done"]

    def add(
        self,
        tokens: list[int],
        features: torch.Tensor,
        labels: torch.Tensor,
        trainable: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_logprobs: torch.Tensor,
        source: str,
        layer_features: torch.Tensor | None = None,
    ) -> None:
        """One sequence: tokens (L,); the rest (L-1, ...) per scored position."""
        self.pending.append(
            {
                "tokens": tokens,
                "features": features,
                "labels": labels,
                "trainable": trainable,
                "topk_ids": topk_ids,
                "topk_logprobs": topk_logprobs,
                "source": source,
                "layer_features": layer_features,
            }
        )

    def flush(self, items_done: int) -> None:
        """Writes the pending sequences as one shard, then records `items_done` in the index."""
        index = self.index
        if self.pending:
            name = f"shard_{len(index['shards']):05d}.safetensors"
            for p in self.pending:
                if p["source"] not in index["sources"]:
                    index["sources"].append(p["source"])
                n, trained = len(p["tokens"]), int(p["trainable"].sum())
                index["tokens_by_source"][p["source"]] = index["tokens_by_source"].get(p["source"], 0) + n
                trained_by = index["trained_tokens_by_source"]
                trained_by[p["source"]] = trained_by.get(p["source"], 0) + trained
            tensors = {
                "tokens": torch.tensor([t for p in self.pending for t in p["tokens"]], dtype=torch.int32),
                "lengths": torch.tensor([len(p["tokens"]) for p in self.pending], dtype=torch.int64),
                "sources": torch.tensor([index["sources"].index(p["source"]) for p in self.pending], dtype=torch.int32),
                "labels": torch.cat([p["labels"] for p in self.pending]).to(torch.int32),
                "features": torch.cat([p["features"] for p in self.pending]).to(torch.bfloat16),
                "trainable": torch.cat([p["trainable"] for p in self.pending]).to(torch.uint8),
                "topk_ids": torch.cat([p["topk_ids"] for p in self.pending]).to(torch.int32),
                "topk_logprobs": torch.cat([p["topk_logprobs"] for p in self.pending]).to(torch.float16),
            }
            if self.pending[0]["layer_features"] is not None:
                tensors["layer_features"] = torch.cat([p["layer_features"] for p in self.pending]).to(torch.bfloat16)
            tensors = {k: v.contiguous() for k, v in tensors.items()}
            write_atomic(self.folder / name, lambda tmp: save_file(tensors, str(tmp)))
            index["shards"].append(
                {
                    "file": name,
                    "sequences": len(self.pending),
                    "tokens": int(tensors["lengths"].sum()),
                    "trained_tokens": int(tensors["trainable"].sum()),
                    "items_done": items_done,
                }
            )
            self.pending = []
        index["done"] = items_done
        write_text_atomic(self.index_path, json.dumps(index, indent=1))


def shards_for(index: dict, max_items: int | None) -> tuple[list[dict], int]:
    """The shards that hold the first `max_items` items (all with None; whole shards, so up to a block more) and
    how many items those are. Each shard records the items done when it was written; an index without that
    (written before it was recorded) can only be read whole."""
    shards, done = index["shards"], index["done"]
    if max_items is None or max_items >= done:
        return shards, done
    if max_items <= 0:
        return [], 0
    if any("items_done" not in shard for shard in shards):
        raise ConfigError(
            f"this data holds {done} records in shards that do not say which records each holds, so "
            f"the first {max_items} cannot be taken alone: give --max-prompts {done}, or another "
            "--data-dir"
        )
    taken = []
    for shard in shards:
        taken.append(shard)
        if shard["items_done"] >= max_items:
            break
    return taken, taken[-1]["items_done"] if taken else 0


def read_shards(folder: Path, feature_layers: tuple[int, ...] = (), max_items: int | None = None) -> list[dict]:
    """The stored sequences (of the first `max_items` items, see shards_for): {"tokens" (L,), "features" (L-1, H)
    (or (L-1, A*H): the inputs of `feature_layers`), "labels", "trainable" (L-1,) bool, "topk_ids", "topk_logprobs"
    (L-1, K), "source"}."""
    index = json.loads((folder / "index.json").read_text())
    held = tuple(index.get("feature_layers", ()))
    missing = [i for i in feature_layers if i not in held]
    if missing:
        raise ConfigError(
            f"{folder} holds the inputs of layers {list(held) or 'none'}, not of {missing} "
            f"(extract the data again with those layers)"
        )
    H = index["hidden_size"]
    columns = torch.cat([torch.arange(H) + H * held.index(i) for i in feature_layers]) if feature_layers else None
    out = []
    for shard in shards_for(index, max_items)[0]:
        with safe_open(str(folder / shard["file"]), framework="pt") as f:
            data = {k: f.get_tensor(k) for k in f.keys() if k not in ("features", "layer_features")}
            data["features"] = (
                f.get_tensor("layer_features")[:, columns] if feature_layers else f.get_tensor("features")
            )
        at_t = at_f = 0
        for i, L in enumerate(data["lengths"].tolist()):
            rows = slice(at_f, at_f + L - 1)
            out.append(
                {
                    "tokens": data["tokens"][at_t : at_t + L].long(),
                    "features": data["features"][rows],
                    "labels": data["labels"][rows].long(),
                    "trainable": data["trainable"][rows].bool(),
                    "topk_ids": data["topk_ids"][rows].long(),
                    "topk_logprobs": data["topk_logprobs"][rows],
                    "source": index["sources"][int(data["sources"][i])],
                }
            )
            at_t += L
            at_f += L - 1
    return out


def read_data(
    folders: list[Path], target, feature_layers: tuple[int, ...] = (), max_items: int | None = None
) -> list[dict]:
    """The sequences of several data folders, each checked to come from this target and to hold the features of
    `feature_layers` (empty: the final hidden state); of each, those of its first `max_items` items (shards_for)."""
    out = []
    for folder in folders:
        index_path = Path(folder) / "index.json"
        if not index_path.is_file():
            raise ConfigError(f"{folder} holds no training data (index.json)")
        index = json.loads(index_path.read_text())
        if index.get("format") != FORMAT:
            raise ConfigError(f"{folder} holds training data in an older format; extract it again")
        if (index.get("target"), index.get("hidden_size")) != (target.name, target.info.hidden_size):
            raise ConfigError(f"{folder} holds data from target {index.get('target')!r}, not {target.name!r}")
        out += read_shards(Path(folder), tuple(feature_layers), max_items)
    return out
