"""One sequence's verify curve (as measured at load) beside passes over several sequences with the same total tokens,
on the built-in model's file: what a batch's draft lengths would be planned on if one curve served both
(docs/drafters.md, "Draft length and tree size come from measurements").

Each batch pass scores S sequences of `--context` cached tokens, one token each plus `extra` drafted rows for the
first four; the least time of `--repeats` rounds, the sizes taking turns (costs.time_by_size).

    python experiments/batch_pass_costs.py --sequences 16 --context 300 640 --out-json experiments/results/x.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def batch_costs(backend, sequences: int, context: int, extras: list[int], repeats: int) -> dict[int, float]:
    """{total tokens: seconds} of passes over `sequences` sequences after `context` cached tokens each."""
    from specdec.costs import time_by_size

    generator = torch.Generator().manual_seed(0)
    caches = [backend.new_cache() for _ in range(sequences)]
    try:
        for cache in caches:
            backend.forward(
                cache, torch.randint(0, backend.info.vocab_size, (context,), generator=generator), last_only=True
            )
        feeds = {
            extra: [
                torch.randint(0, backend.info.vocab_size, (1 + (extra if i < 4 else 0),), generator=generator)
                for i in range(sequences)
            ]
            for extra in extras
        }

        def run(extra: int) -> None:
            backend.forward_batch(caches, feeds[extra], argmax_only=True)

        def reset(_: int) -> None:
            for cache in caches:
                backend.truncate(cache, context)

        timed = time_by_size(run, reset, extras, repeats)
        return {sequences + 4 * extra: seconds for extra, seconds in timed.items()}
    finally:
        for cache in caches:
            backend.release(cache)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--context", type=int, nargs="+", default=[300])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out-json")
    args = parser.parse_args()
    from specdec.benchmarks.runner import machine_info
    from specdec.costs import measure_verify_costs
    from specdec.models.loading import load_model

    backend = load_model(args.model, max_context=2048, slots=args.sequences).backend
    sizes = (1, 2, 4, 8, 16, 20, 24, 32, 48)
    report = {
        "model": args.model,
        "machine": machine_info(),
        "one_sequence_after_128_s": measure_verify_costs(backend, sizes=sizes, repeats=args.repeats),
        "batches": {},
    }
    for context in args.context:
        costs = batch_costs(backend, args.sequences, context, [0, 1, 2, 4, 8], args.repeats)
        report["batches"][f"{args.sequences}_sequences_after_{context}_s"] = costs
        print(context, {t: round(s * 1e3, 2) for t, s in costs.items()}, flush=True)
    print("one sequence", {t: round(s * 1e3, 2) for t, s in report["one_sequence_after_128_s"].items()})
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
