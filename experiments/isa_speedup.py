"""Plain decoding against a drafter with specdec's CPU kernels built for a chosen instruction set, alternated prompt
by prompt in one process (so that a busy spell on a shared machine falls on both): how the drafter pays on a CPU
with only AVX2 (the `avx2` build, whose bfloat16 weights are multiplied in float32), measured on one that has more.
The memory bandwidth is this machine's, so the figure says what the AVX2 code costs, not what an AVX2 machine does.

    python experiments/isa_speedup.py --isa avx2 --prompts ../shared/data/specbench_dev.jsonl --limit 26 \\
        --out-json experiments/results/zen4_avx2_build_quantized.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--isa", choices=("avx2", "avx512"), required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()

    import specdec.kernels as kernels

    if args.isa == "avx512" and kernels.instruction_set() != "avx512":
        sys.exit("this CPU does not run the avx512 build")
    kernels.instruction_set = lambda: args.isa  # what the loader builds for, as on a CPU with no more than that
    from alternate import alternate
    from specdec.choice import OWN_DRAFTER, PLAIN
    from specdec.benchmarks.prompts import load_prompts
    from specdec.benchmarks.runner import machine_info
    from specdec.config import GenerationConfig
    from specdec.engine import SpecDecoder

    decoder = SpecDecoder.load(drafter=args.drafter, dtype=args.dtype)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    prompts = load_prompts(args.prompts, args.limit)
    totals, equal = alternate(decoder, prompts, config, {"none": PLAIN, "drafter": OWN_DRAFTER})
    result = {"isa": args.isa, "bf16_products": kernels.has_bf16_products(),
              "drafter": decoder.drafter.name if decoder.drafter else None, "dtype": args.dtype,
              "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "equal_to_plain": equal,
              "speedup": totals["drafter"]["tokens_per_s"] / totals["none"]["tokens_per_s"], "methods": totals,
              "machine": machine_info()}
    Path(args.out_json).write_text(json.dumps(result, indent=1))
    print(f"{args.isa} build, {result['drafter']}: {result['speedup']:.2f}x plain decoding "
          f"({totals['drafter']['tokens_per_s']:.1f} against {totals['none']['tokens_per_s']:.1f} tokens/s, MAT "
          f"{totals['drafter']['mean_accepted_tokens']:.2f}), {equal}/{len(prompts)} equal")


if __name__ == "__main__":
    main()
