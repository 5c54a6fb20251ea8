"""A bfloat16 model's KV cache in bfloat16 (kernels-bf16kv) against float32 (kernels), plain decoding and the
default drafter, alternated prompt by prompt in one process (so that a busy spell on a shared machine falls on all
four): what half the cache's bytes buys at Spec-Bench's contexts and at long ones (--long N: N prompts of about
--long-tokens tokens, each several Spec-Bench documents one after another, then the last one's question), and
one-token passes of the target and of its 4-bit copy timed alone at growing contexts (--pass-contexts).

    python experiments/kv_dtype_speedup.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 --long 4 \\
        --out-json experiments/results/zen4_kv_dtype.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def long_prompts(prompts, count: int, tokens: int, encode) -> list:
    """`count` prompts of about `tokens` tokens (objects with .text): the longest prompts' texts joined, rotating
    which comes last."""
    from types import SimpleNamespace

    texts = [p.text for p in sorted(prompts, key=lambda p: -len(p.text))[:8]]
    made = []
    for i in range(count):
        order = texts[i % len(texts):] + texts[:i % len(texts)]
        last, joined = order.pop(), []
        while order and len(encode("\n\n".join(joined + [order[0], last]))) < tokens:
            joined.append(order.pop(0))
        made.append(SimpleNamespace(text="\n\n".join(joined + [last])))
    return made


def time_passes(backend, copy, pools: dict, contexts: list[int], repeats: int = 25) -> dict:
    """{context: {"<cache>_target"|"<cache>_copy": median ms}} of one-token passes of the target (backend) and its
    4-bit copy after `context` cached tokens, each pool's pass alternated with the other's."""
    import statistics

    import torch

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
                                 torch.arange(1), 0, False, no_layers, False)
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

    from alternate import alternate
    from specdec.benchmarks.prompts import load_prompts
    from specdec.benchmarks.runner import machine_info
    from specdec.config import GenerationConfig
    from specdec.choice import OWN_DRAFTER, PLAIN
    from specdec.engine import SpecDecoder

    decoders = {"bf16": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels-bf16kv"),
                "f32": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels")}
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    sets = {"specbench": load_prompts(args.prompts, args.limit),
            "long": long_prompts(load_prompts(args.prompts), args.long, args.long_tokens, decoders["bf16"].encode)}
    methods = {f"{kv}_{drafter}": (decoder, PLAIN if drafter == "none" else OWN_DRAFTER)
               for kv, decoder in decoders.items() for drafter in ("none", "auto")}
    result = {"max_new_tokens": args.max_new_tokens, "machine": machine_info(), "sets": {}}
    for set_name, prompts in sets.items():
        counts = {"equal_to_plain": 0, "same_across_kv": 0, "prompt_tokens": 0}

        def compare(prompt, outputs) -> None:
            counts["equal_to_plain"] += all(outputs[f"{kv}_auto"] == outputs[f"{kv}_none"] for kv in decoders)
            counts["same_across_kv"] += outputs["bf16_none"] == outputs["f32_none"]
            counts["prompt_tokens"] += len(decoders["f32"].encode(prompt.text))

        totals, _ = alternate(None, prompts, config, methods, each=compare)
        n = len(prompts)
        result["sets"][set_name] = {"prompts": n, "mean_prompt_tokens": counts["prompt_tokens"] / n,
                                    "auto_equal_to_plain": counts["equal_to_plain"],
                                    "bf16_kv_same_as_f32_kv": counts["same_across_kv"], "methods": totals}
        t = {k: v["tokens_per_s"] for k, v in totals.items()}
        print(f"{set_name} ({n} prompts, {counts['prompt_tokens'] / n:.0f} prompt tokens): plain bf16 KV "
              f"{t['bf16_none']:.1f}, f32 KV {t['f32_none']:.1f} tokens/s ({t['bf16_none'] / t['f32_none']:.2f}x); "
              f"auto {t['bf16_auto'] / t['bf16_none']:.2f}x plain with bf16 KV, {t['f32_auto'] / t['f32_none']:.2f}x "
              f"with f32 KV; auto = plain {counts['equal_to_plain']}/{n}; bf16 KV output = f32 KV output "
              f"{counts['same_across_kv']}/{n}")
    backend = decoders["bf16"].target.backend
    passes = time_passes(backend, decoders["bf16"].drafter.copy,
                         {"bf16": backend.pool, "f32": decoders["f32"].target.backend.pool},
                         [int(c) for c in args.pass_contexts.split(",")])
    result["one_token_pass_ms"] = passes
    for context, ms in passes.items():
        print(f"one-token pass at {context} tokens: target {ms['f32_target']:.2f} -> {ms['bf16_target']:.2f} ms, "
              f"copy {ms['f32_copy']:.2f} -> {ms['bf16_copy']:.2f} ms (float32 -> bfloat16 cache)")
    Path(args.out_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
