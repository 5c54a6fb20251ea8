"""Held-out agreement of trained EAGLE heads with the target on one training-data folder, as train-drafter's learning
curve measures it (top-1 agreement at each draft depth and the chain MAT it implies), for heads that did not
train on that folder (the shipped head, or one trained on other data) next to one that did.

    python bench/heldout_agreement.py --data $SPECDEC_CACHE/train-data/<folder> --max-prompts 2048 \
        --exclude-source alpaca_eval-answer --head shipped=specdec/assets/heads/smollm2-135m \
        --head own=$SPECDEC_CACHE/heads/smollm2-135m-own-top1 --out-json bench/results/cpu/heldout_agreement.json

The held-out sequences are chosen by a hash of their tokens (3%, at most 200), so every head is scored on the same
ones, which a head trained on the folder never saw.

`--whole` scores every sequence instead, for a folder no head trained on: answers to evaluation prompts, extracted
with `specdec train-drafter --data PROMPTS.jsonl --data-dir DIR --data-only` (for example Spec-Bench's first turns,
as `{"prompt": ..., "source": "specbench-<category>"}` lines, to measure agreement on its answers without
training on them). `--by-source` adds each source's agreement.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specdec.drafters.heads.eagle_loading import load_head
from specdec.models.loading import load_model
from specdec.models.registry import DEFAULT_MODEL
from specdec.training.batching import TrainSettings, windows
from specdec.training.datamix import source_family, without_families
from specdec.training.heldout import heldout_agreement, scorable, split_heldout
from specdec.training.shards import read_data


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a train-drafter data folder")
    p.add_argument("--max-prompts", type=int, default=None, help="its first N records only")
    p.add_argument("--exclude-source", action="append", default=[], metavar="FAMILY")
    p.add_argument("--head", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--whole", action="store_true", help="score every sequence (a folder no head trained on)")
    p.add_argument("--by-source", action="store_true", help="also score each source family alone")
    p.add_argument("--out-json", default=None)
    args = p.parse_args()
    target = load_model(args.model, dtype="float32")
    sequences = without_families(read_data([Path(args.data)], target, max_items=args.max_prompts),
                                 args.exclude_source)
    settings = TrainSettings()
    if args.whole:
        heldout = [w for s in scorable(sequences) for w in windows(s, settings.max_len)]
    else:
        _, heldout = split_heldout(sequences, settings)
    by_source: dict[str, list[dict]] = {}
    for window in heldout:
        by_source.setdefault(source_family(window.get("source", "?")), []).append(window)
    results = {}
    for spec in args.head:
        name, _, folder = spec.partition("=")
        head = load_head(folder, target).float()
        results[name] = {"head": folder, **heldout_agreement(head, heldout, settings)}
        if args.by_source:
            results[name]["by_source"] = {source: heldout_agreement(head, group, settings)
                                          for source, group in sorted(by_source.items())}
        print(name, json.dumps(results[name]), file=sys.stderr)
    record = {"data": args.data, "max_prompts": args.max_prompts, "excluded_sources": args.exclude_source,
              "whole": args.whole, "heldout_windows": len(heldout),
              "windows_by_source": {source: len(group) for source, group in sorted(by_source.items())},
              "heads": results}
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
