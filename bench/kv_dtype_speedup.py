"""A bfloat16 model's KV cache in bfloat16 (the default) against float32, plain decoding and the default drafter,
alternated prompt by prompt in one process (so that a busy spell on a shared machine falls on all four): what half
the cache's bytes buys at Spec-Bench's contexts and at long ones (--long N: N prompts of about --long-tokens tokens,
each several Spec-Bench documents one after another, then the last one's question).

    python bench/kv_dtype_speedup.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 --long 4 \\
        --out-json bench/results/zen4_kv_dtype.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def long_prompts(prompts, count: int, tokens: int, encode) -> list[str]:
    """`count` prompts of about `tokens` tokens: the longest prompts' texts joined, rotating which comes last."""
    texts = [p.text for p in sorted(prompts, key=lambda p: -len(p.text))[:8]]
    made = []
    for i in range(count):
        order = texts[i % len(texts):] + texts[:i % len(texts)]
        joined = []
        while order and len(encode("\n\n".join(joined + [order[-1]]))) < tokens:
            joined.insert(0, order.pop(0))
        made.append("\n\n".join(joined))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=3000)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()

    import torch

    from specdec.bench.prompts import load_prompts
    from specdec.bench.runner import machine_info
    from specdec.config import GenerationConfig
    from specdec.costs import CostModel, measure_verify_costs
    from specdec.engine import SpecDecoder
    from specdec.models.kvpool import KVPool

    decoders = {"bf16": SpecDecoder.load(drafter="auto", dtype="bfloat16")}
    float32 = SpecDecoder.load(drafter="auto", dtype="bfloat16", calibrate=False)
    keys = float32.target.backend.pool.keys
    float32.target.backend.pool = KVPool(keys.shape[0], keys.shape[1], keys.shape[2], keys.shape[3], keys.shape[4],
                                         torch.float32, keys.device, zeroed=False)
    float32.costs = CostModel(measure_verify_costs(float32.target.backend))  # as load() calibrates, on this cache
    float32.warm_up()
    decoders["f32"] = float32
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    prompts = load_prompts(args.prompts, args.limit)
    sets = {"specbench": [p.text for p in prompts],
            "long": long_prompts(load_prompts(args.prompts), args.long, args.long_tokens, decoders["bf16"].encode)}
    result = {"max_new_tokens": args.max_new_tokens, "machine": machine_info(), "sets": {}}
    for set_name, texts in sets.items():
        methods = [(kv, drafter) for kv in decoders for drafter in ("none", "auto")]
        totals = {f"{kv}_{d}": {"tokens": 0, "seconds": 0.0, "steps": 0} for kv, d in methods}
        equal_to_plain, same_across_kv, context = 0, 0, 0
        for i, text in enumerate(texts):
            outputs = {}
            for kv, drafter in methods[i % 4:] + methods[:i % 4]:
                decoder = decoders[kv]
                ids = decoder.encode(text)
                start = time.perf_counter()
                state = decoder.complete(ids, config, drafter=None if drafter == "none" else "default")
                total = totals[f"{kv}_{drafter}"]
                total["seconds"] += time.perf_counter() - start
                total["tokens"] += len(state.generated)
                total["steps"] += state.metrics.steps
                outputs[(kv, drafter)] = list(state.generated)
            context += len(ids)
            equal_to_plain += all(outputs[(kv, "auto")] == outputs[(kv, "none")] for kv in decoders)
            same_across_kv += outputs[("bf16", "none")] == outputs[("f32", "none")]
        for total in totals.values():
            total["tokens_per_s"] = total["tokens"] / total["seconds"]
        result["sets"][set_name] = {"prompts": len(texts), "mean_prompt_tokens": context / len(texts),
                                    "auto_equal_to_plain": equal_to_plain, "bf16_kv_same_as_f32_kv": same_across_kv,
                                    "methods": totals}
        t = {k: v["tokens_per_s"] for k, v in totals.items()}
        print(f"{set_name} ({len(texts)} prompts, {context / len(texts):.0f} prompt tokens): plain bf16 KV "
              f"{t['bf16_none']:.1f}, f32 KV {t['f32_none']:.1f} tokens/s ({t['bf16_none'] / t['f32_none']:.2f}x); "
              f"auto {t['bf16_auto'] / t['bf16_none']:.2f}x plain with bf16 KV, {t['f32_auto'] / t['f32_none']:.2f}x "
              f"with f32 KV; auto = plain {equal_to_plain}/{len(texts)}; bf16 KV output = f32 KV output "
              f"{same_across_kv}/{len(texts)}")
    Path(args.out_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
