"""The CPU kernels' screened LM head (kernels/argmax_screen.h) against the full head, in one process:

- on the real model (smollm2-135m, bfloat16), plain decoding and `auto` with and without the screen, alternated
  prompt by prompt (experiments/alternate.py), outputs compared;
- on random-weight shapes (--shapes), one-token decoding steps after a 125-token prompt, the two alternated round
  by round, and the tokens compared.

    python experiments/screened_head_ab.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 \\
        --shapes qwen3-0.6b --out-json experiments/results/zen3_screened_head_ab.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def without_screen(backend) -> None:
    """The backend's kernel model rebuilt as KernelLlama(screened_head=False) builds it, on the same KV pool."""
    from specdec.kernels import load
    from specdec.models.kernel_llama import kernel_model_args

    args = kernel_model_args(backend._hf_model, backend.max_context)
    backend.model = load().CpuLlama(*args, backend.bf16_products or backend.bf16_prefill, False, False)
    backend.screened_head = False


def shape_steps(name: str, rounds: int, steps: int) -> dict:
    """Median and minimum ms of one-token steps with argmax_only (screened) and without, and whether the greedy
    tokens were the same."""
    import torch

    from specdec.models.shapes import load_shape

    backend = load_shape(name, "cpu", "bfloat16", "kernels", max_context=1024).loaded.backend
    prompt = torch.randint(0, backend.info.vocab_size, (125,), generator=torch.Generator().manual_seed(0))
    times, tokens = {False: [], True: []}, {False: [], True: []}
    for r in range(rounds):
        for screened in ((False, True) if r % 2 == 0 else (True, False)):
            cache = backend.new_cache()
            token = int(backend.forward(cache, prompt, last_only=True, argmax_only=screened).logits[-1].argmax())
            made = [token]
            for _ in range(steps):
                start = time.perf_counter()
                token = int(backend.forward(cache, torch.tensor([token]), argmax_only=screened).logits[-1].argmax())
                times[screened].append(time.perf_counter() - start)
                made.append(token)
            tokens[screened].append(made)
            backend.release(cache)
    out = {("screened" if s else "full"): {"median_ms": statistics.median(t) * 1e3, "min_ms": min(t) * 1e3,
                                           "steps": len(t)} for s, t in times.items()}
    out["step_speedup"] = out["full"]["median_ms"] / out["screened"]["median_ms"]
    out["same_tokens"] = tokens[False] == tokens[True]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--shapes", default="qwen3-0.6b", help="comma-separated shapes for the step timing ('' none)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--out-json", required=True)
    args = parser.parse_args()

    from alternate import alternate
    from specdec.benchmarks.prompts import load_prompts
    from specdec.benchmarks.runner import machine_info
    from specdec.choice import OWN_DRAFTER, PLAIN
    from specdec.config import GenerationConfig
    from specdec.engine import SpecDecoder

    decoders = {"screened": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels"),
                "full": SpecDecoder.load(drafter="auto", dtype="bfloat16", backend="kernels")}
    without_screen(decoders["full"].target.backend)
    methods = {f"{head}_{drafter}": (decoder, PLAIN if drafter == "none" else OWN_DRAFTER)
               for head, decoder in decoders.items() for drafter in ("none", "auto")}
    prompts = load_prompts(args.prompts, args.limit)
    totals, equal = alternate(None, prompts, GenerationConfig(max_new_tokens=args.max_new_tokens), methods)
    t = {name: total["tokens_per_s"] for name, total in totals.items()}
    print(f"{len(prompts)} prompts, all four outputs equal on {equal}: plain {t['full_none']:.1f} -> "
          f"{t['screened_none']:.1f} tokens/s ({t['screened_none'] / t['full_none']:.3f}x), auto {t['full_auto']:.1f} "
          f"-> {t['screened_auto']:.1f} ({t['screened_auto'] / t['full_auto']:.3f}x)")
    result = {"max_new_tokens": args.max_new_tokens, "machine": machine_info(), "prompts": len(prompts),
              "outputs_equal": equal, "methods": totals, "shapes": {}}
    for name in filter(None, args.shapes.split(",")):
        result["shapes"][name] = steps = shape_steps(name, args.rounds, args.steps)
        print(f"{name}: one-token step {steps['full']['median_ms']:.2f} -> {steps['screened']['median_ms']:.2f} ms "
              f"({steps['step_speedup']:.3f}x), same tokens: {steps['same_tokens']}")
    Path(args.out_json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
