"""How close each dtype/backend's greedy output stays to a float32 reference, over many prompts.

    python bench/fidelity.py --prompts ../shared/data/specbench_dev.jsonl --limit 240 --out-json bench/results/cpu/fidelity_240_prompts.json

Each variant answers every prompt greedily (batched: the kernels give the same tokens batched or alone) and is
compared with the first variant, the reference: prompts with identical output, and the mean number of tokens
before the first difference. Speed here is not a benchmark (batched, other variants' threads); see `specdec bench`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from specdec import SpecDecoder, SpecdecError
from specdec.benchmarks.prompts import load_prompts

DEFAULT_VARIANTS = "float32/kernels-fp32,bfloat16/kernels,bfloat16/kernels-fp32,bfloat16/kernels-bf16"


def compare(reference: list[list[int]], tokens: list[list[int]]) -> dict:
    """Identical outputs and tokens before the first difference, against the reference (lists of token ids)."""
    prefixes = [next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                for got, want in zip(tokens, reference)]
    return {"identical": sum(g == w for g, w in zip(tokens, reference)), "prompts": len(reference),
            "mean_common_prefix": round(statistics.mean(prefixes), 2), "median_common_prefix": statistics.median(prefixes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL")
    p.add_argument("--limit", type=int, default=240)
    p.add_argument("--model", default=None, help="default: the built-in default model")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help="DTYPE/BACKEND,...; the first is the reference")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    prompts = load_prompts(args.prompts, args.limit)
    runs = {}
    for variant in args.variants.split(","):
        dtype, backend = variant.split("/")
        decoder = SpecDecoder.load(args.model, drafter="none", dtype=dtype, backend=backend, calibrate=False)
        t0 = time.perf_counter()
        outputs = decoder.generate_many([q.text for q in prompts], max_new_tokens=args.max_new_tokens, max_batch=16)
        runs[variant] = {"seconds": round(time.perf_counter() - t0, 1), "tokens": [o.token_ids for o in outputs]}
        print(f"{variant}: {runs[variant]['seconds']} s", flush=True)
    reference = next(iter(runs.values()))["tokens"]
    summary = {name: compare(reference, run["tokens"]) for name, run in list(runs.items())[1:]}
    for name, row in summary.items():
        print(f"{name:26s} identical {row['identical']}/{row['prompts']}, mean common prefix {row['mean_common_prefix']}")
    meta = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens,
            "reference": next(iter(runs)), "question_ids": [q.question_id for q in prompts]}
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, "summary": summary, "runs": runs}, f)


if __name__ == "__main__":
    try:
        main()
    except SpecdecError as exc:
        raise SystemExit(f"fidelity: {exc}") from None
