"""The quantized copy's drafting with its attention by pieces of keys (kernels/attention_split.h) and with the
target's order, beside plain decoding, alternated prompt by prompt in one process (so that a busy spell on a shared
machine falls on all three): what reading each cached key once buys the default drafter, most at long contexts.

    python experiments/split_attention_speedup.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 \\
        --out-json experiments/results/zen4_split_attention.json
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from alternate import ab_arguments, copy_ab, named_copy

    args = ab_arguments(__doc__.split("\n\n")[0])
    import specdec.kernels as kernels
    from specdec.engine import SpecDecoder

    decoder = SpecDecoder.load(drafter="quantized", dtype=args.dtype)
    backend, own, module = decoder.target.backend, decoder.drafter, kernels.load()
    drafters = {name: named_copy(backend, own.copy, f"quantized_{name}", split, module, own.passes)
                for name, split in (("pieces", True), ("rows", False))}
    result = copy_ab(args, decoder, drafters)
    speedup, totals = result["speedup_over_none"], result["methods"]
    print(f"quantized copy, attention by pieces {speedup['pieces']:.2f}x plain decoding, by rows "
          f"{speedup['rows']:.2f}x (drafting {totals['pieces']['draft_s']:.1f} s against "
          f"{totals['rows']['draft_s']:.1f} s); {result['equal_to_plain']}/{result['prompts']} equal")


if __name__ == "__main__":
    main()
