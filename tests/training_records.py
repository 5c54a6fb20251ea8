"""Training records for tests: sentences the tiny word-level tokenizer knows, JSONL files of records, and their
extraction through a target into shards."""
import json

from specdec.training.extract import Extractor, data_meta
from specdec.training.shards import ShardWriter

SENTENCES = ["the cat sat on the mat", "a big red dog ran to the house", "the sun and the moon", "she was in the tree",
             "they ran up and down the hill", "we see the blue sky"]


def write_jsonl(path, rows):
    """Writes `rows` (dicts) to `path` as JSON lines; returns the path."""
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def extract(target, items, folder, **kwargs):
    """Extracts `items` through `target` into shards in `folder` (12 new tokens an item, batches of 2); `kwargs`
    go to Extractor.run (block=...)."""
    writer = ShardWriter(folder, data_meta(target, 12, 0.0))
    return Extractor(target, max_new_tokens=12, batch_size=2, max_len=256).run(items, writer, progress=False,
                                                                                 **kwargs)
