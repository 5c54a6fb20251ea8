"""What a load of a GGUF file makes of its metadata, kept in specdec's cache for the next load of the same file.

Parsing a file's metadata with the gguf package's reader and converting its config and tokenizer with transformers
takes seconds (smollm2's 49,152-token vocabulary: about 2.5 s to parse and 2.5 s to convert on a Zen 3; a 151,936-
token one several times that), and none of it changes until the file does. So the first load of a file writes, in
`<cache>/gguf-index/<key>/`, transformers' own files for the config and tokenizer it converted (`save_pretrained`)
and the index of the file's tensors the reader found (name, GGML type, dims, and where its bytes lie); a later load
of the same file reads those and maps the tensors' bytes at the recorded offsets, as the reader maps them.

An entry is written only where what it reads back is the same model: the same config, and a tokenizer that
encodes, decodes and renders the chat template as the converted one does on a few probe texts. It is keyed by the
file's real path, size, modification time and inode, and records the versions of the index, transformers and gguf
that made it and a digest of the file's bytes before its first tensor (all the entry holds of it): a file changed
or replaced, or a library upgraded, misses and is parsed again. An entry that cannot be
read is a miss too, and is replaced; one that cannot be written is skipped (a read-only cache): the cache only saves
time. The most recently used entries are kept (KEEP).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..files import cache_root, write_text_atomic

INDEX_VERSION = 1
KEEP = 16  # entries kept, the most recently used


@dataclass
class IndexedTensor:
    """A tensor of the file as the gguf package's reader describes it (ReaderTensor's fields that loads read): name,
    tensor_type (GGMLQuantizationType), shape (its GGUF dims, innermost first) and data (a read-only view of the
    mapped file: the reader's dtype and shape, bytes (rows, bytes a row) for a quantized type)."""

    name: str
    tensor_type: Any
    shape: np.ndarray
    data: np.ndarray


@dataclass
class CachedMetadata:
    config: Any
    tokenizer: Any
    tensors: list[IndexedTensor]


def _versions() -> dict:
    from importlib.metadata import version

    import transformers

    return {"index": INDEX_VERSION, "transformers": transformers.__version__, "gguf": version("gguf")}


def _identity(path: Path) -> dict:
    stat = os.stat(path)
    return {"path": os.path.realpath(path), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "inode": stat.st_ino}


def _metadata_digest(path: Path, count: int) -> str:
    """sha256 of the file's first `count` bytes: all that an entry holds of it (a few MB: milliseconds)."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read(count)).hexdigest()


def index_root() -> Path:
    """The folder of the entries."""
    return cache_root() / "gguf-index"


def _entry(identity: dict) -> Path:
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:24]
    return index_root() / key


def load_cached(path: Path) -> CachedMetadata | None:
    """The config, tokenizer and tensors of the file as its last load made them, or None (not cached, the file or
    a library changed, or the entry is damaged: whatever fails to read it, the tokenizers library's own errors
    included, means a parse of the file instead)."""
    try:
        identity = _identity(path)
        folder = _entry(identity)
        index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
        if index["file"] != identity or index["versions"] != _versions():
            return None
        if _metadata_digest(path, index["metadata_bytes"]) != index["metadata_sha256"]:
            return None  # rewritten in place within the clock's resolution
        metadata = CachedMetadata(*_from_folder(folder, path), tensors=_mapped(path, index["tensors"]))
        os.utime(folder / "index.json")  # most recently used (_prune)
        return metadata
    except Exception:  # noqa: BLE001 (a damaged entry is a miss, never a failed load)
        return None


def _from_folder(folder: Path, path: Path) -> tuple[Any, Any]:
    """transformers' config and tokenizer from the entry's files, named as a load of the file names them."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
    tokenizer = AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)
    config._name_or_path = tokenizer.name_or_path = str(path.parent)
    return config, tokenizer


def _mapped(path: Path, records: list[dict]) -> list[IndexedTensor]:
    from gguf import GGMLQuantizationType

    mapped = np.memmap(path, dtype=np.uint8, mode="r").view(np.ndarray)  # a plain view: see gguf_parsing.py
    tensors = []
    for r in records:
        dtype = np.dtype(r["dtype"])
        count = int(np.prod(r["data_shape"]))
        start, end = r["offset"], r["offset"] + count * dtype.itemsize
        if end > mapped.size:
            raise ValueError(f"tensor {r['name']} lies past the end of the file")
        data = mapped[start:end].view(dtype).reshape(r["data_shape"])
        tensors.append(IndexedTensor(r["name"], GGMLQuantizationType(r["type"]), np.array(r["dims"]), data))
    return tensors


def store(path: Path, config, tokenizer, tensors) -> None:
    """Writes the entry of the file (its reader's `tensors`, and the config and tokenizer made from it), whole or
    not at all; a cache that cannot be written is left as it is."""
    try:
        identity = _identity(path)
        folder = _entry(identity)
        folder.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    except OSError:
        return
    try:
        config.save_pretrained(str(building))
        tokenizer.save_pretrained(str(building))
        if _round_trip_problem(building, path, config, tokenizer) is None:
            records = [_record(path, t) for t in tensors]
            head = min(r["offset"] for r in records)  # the metadata and tensor infos, before the first tensor
            index = {
                "file": identity,
                "versions": _versions(),
                "metadata_bytes": head,
                "metadata_sha256": _metadata_digest(path, head),
                "tensors": records,
            }
            write_text_atomic(building / "index.json", json.dumps(index))
            shutil.rmtree(folder, ignore_errors=True)  # a damaged entry of the same file
            os.replace(building, folder)
    except Exception:  # noqa: BLE001 (what cannot be cached is parsed again next time, never a failed load)
        pass
    finally:
        shutil.rmtree(building, ignore_errors=True)
    _prune(folder.parent)


# texts whose encodings a saved tokenizer must reproduce: words, spaces and lines, digits, accents, CJK, emoji, and
# the special tokens' own text (added at check time)
_PROBES = [
    "Hello, world! 12345 + 678 = 9,023.",
    "  two  spaces\n\nnew lines\tand a tab ",
    "naïve café Ünïcödé",
    "漢字とかな、한국어",
    "emoji 🙂👍🏽 and symbols <>&%$#@",
]


def _round_trip_problem(folder: Path, path: Path, config, tokenizer) -> str | None:
    """What the config and tokenizer read back from `folder` do differently from those the file made, or None: an
    entry is written only where they are the same model (its config, and its tokenizer's encodings, decodings,
    special tokens and chat template on _PROBES)."""
    again_config, again = _from_folder(folder, path)
    if again_config.to_dict() != {**config.to_dict(), "_name_or_path": str(path.parent)}:
        return "config"
    texts = [*_PROBES, " ".join(str(t) for t in tokenizer.all_special_tokens)]
    for text in texts:
        ids = tokenizer(text)["input_ids"]
        if again(text)["input_ids"] != ids or again.decode(ids) != tokenizer.decode(ids):
            return f"tokenizer on {text!r}"
    if again.all_special_ids != tokenizer.all_special_ids or len(again) != len(tokenizer):
        return "special tokens"
    if getattr(tokenizer, "chat_template", None):
        chat = [{"role": "user", "content": _PROBES[0]}, {"role": "assistant", "content": _PROBES[2]}]
        render = {"tokenize": False, "add_generation_prompt": True}
        if again.apply_chat_template(chat, **render) != tokenizer.apply_chat_template(chat, **render):
            return "chat template"
    return None


def _record(path: Path, tensor) -> dict:
    data = np.asarray(tensor.data)
    return {
        "name": tensor.name,
        "type": int(tensor.tensor_type),
        "dims": [int(n) for n in tensor.shape],
        "offset": int(tensor.data_offset),
        "dtype": data.dtype.str,
        "data_shape": list(data.shape),
    }


def _prune(root: Path) -> None:
    """Removes all but the KEEP most recently used entries."""
    try:
        entries = [p for p in root.iterdir() if (p / "index.json").is_file()]
        entries.sort(key=lambda p: (p / "index.json").stat().st_mtime_ns, reverse=True)
    except OSError:
        return
    for stale in entries[KEEP:]:
        shutil.rmtree(stale, ignore_errors=True)
