"""A bfloat16 model's KV cache in bfloat16 (kernels-bf16kv) against float32 (kernels), plain decoding and the
default drafter, alternated prompt by prompt in one process (so that a busy spell on a shared machine falls on all
four): what half the cache's bytes buys at Spec-Bench's contexts and at long ones (--long N: N prompts of about
--long-tokens tokens, each several Spec-Bench documents one after another, then the last one's question), and
one-token passes of the target and of its 4-bit copy timed alone at growing contexts (--pass-contexts).

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


def time_passes(backend, pools: dict, contexts: list[int], repeats: int = 25) -> dict:
    """{context: {"<cache>_target"|"<cache>_copy": median ms}} of one-token passes after `context` cached tokens,
    each pool's pass alternated with the other's."""
    import statistics

    import torch

    copy = backend.four_bit_copy()
    no_mask, no_layers = torch.empty(0, dtype=torch.uint8), torch.empty(0, dtype=torch.long)
    own_pool, out = backend.pool, {}
    try:
        for context in contexts:
            caches, times = {}, {f"{name}_{what}": [] for name in pools for what in ("target", "copy")}
            for name, pool in pools.items():
                backend.pool = pool
                caches[name] = backend.new_cache()
                backend.forward(caches[name], torch.randint(0, backend.info.vocab_size, (context,),
                                                            generator=torch.Generator().manual_seed(context)))
            for _ in range(repeats):
                for name, pool in pools.items():
                    backend.pool, cache = pool, caches[name]
                    start = time.perf_counter()
                    backend.forward(cache, torch.tensor([5]), last_only=True)
                    times[f"{name}_target"].append(time.perf_counter() - start)
                    backend.truncate(cache, context)
                    start = time.perf_counter()
                    copy.forward(torch.tensor([5]), torch.tensor([0, 1]), torch.tensor([cache.slot]),
                                 torch.tensor([context]), torch.tensor([context]), no_mask, pool.keys, pool.values,
                                 torch.arange(1), 0, False, no_layers)
                    times[f"{name}_copy"].append(time.perf_counter() - start)
            out[context] = {key: round(statistics.median(t[3:]) * 1e3, 3) for key, t in times.items()}
            for name, pool in pools.items():
                backend.pool = pool
                backend.release(caches[name])
    finally:
        backend.pool = own_pool
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--long", type=int, default=4)
    parser.add_argument("--long-tokens", type=int, default=3000)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--pass-contexts", default="200,1000,3000,6000")
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()

    from specdec.bench.prompts import load_prompts
    from specdec.bench.runner import machine_info
    from specdec.config import GenerationConfig
    from specdec.engine import SpecDecoder

    decoders = {"bf16": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels-bf16kv"),
                "f32": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels")}
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
    backend = decoders["bf16"].target.backend
    passes = time_passes(backend, {"bf16": backend.pool, "f32": decoders["f32"].target.backend.pool},
                         [int(c) for c in args.pass_contexts.split(",")])
    result["one_token_pass_ms"] = passes
    for context, ms in passes.items():
        print(f"one-token pass at {context} tokens: target {ms['f32_target']:.2f} -> {ms['bf16_target']:.2f} ms, "
              f"copy {ms['f32_copy']:.2f} -> {ms['bf16_copy']:.2f} ms (float32 -> bfloat16 cache)")
    Path(args.out_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
