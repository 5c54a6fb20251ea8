"""The quantized copy's drafting with its attention by pieces of keys (kernels/attention_split.h) and with the
target's order, beside plain decoding, alternated prompt by prompt in one process (so that a busy spell on a shared
machine falls on all three): what reading each cached key once buys the default drafter, most at long contexts.

    python bench/split_attention_speedup.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 \\
        --out-json bench/results/zen4_split_attention.json
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
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()

    import specdec.kernels as kernels
    from specdec.bench.alternate import alternate, named_copy
    from specdec.bench.prompts import load_prompts
    from specdec.bench.runner import machine_info
    from specdec.config import GenerationConfig
    from specdec.engine import SpecDecoder

    decoder = SpecDecoder.load(drafter="quantized", dtype=args.dtype)
    backend, module = decoder.target.backend, kernels.load()
    drafters = {name: named_copy(backend, backend.four_bit_copy(), f"quantized_{name}", split, module)
                for name, split in (("pieces", True), ("rows", False))}
    for drafter in drafters.values():
        decoder.warm_up(drafter=drafter)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    prompts = load_prompts(args.prompts, args.limit)
    totals, equal = alternate(decoder, prompts, config, {"none": None, **drafters})
    speedup = {name: totals[name]["tokens_per_s"] / totals["none"]["tokens_per_s"] for name in drafters}
    result = {"dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "equal_to_plain": equal, "speedup_over_none": speedup, "methods": totals, "machine": machine_info()}
    Path(args.out_json).write_text(json.dumps(result, indent=1))
    print(f"quantized copy, attention by pieces {speedup['pieces']:.2f}x plain decoding, by rows "
          f"{speedup['rows']:.2f}x (drafting {totals['pieces']['draft_s']:.1f} s against "
          f"{totals['rows']['draft_s']:.1f} s); {equal}/{len(prompts)} equal")


if __name__ == "__main__":
    main()
