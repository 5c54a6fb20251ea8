"""Prefix caching on conversations: a turn's prompt holds the earlier turns, whose keys and values it reuses.

    python bench/prefix_cache.py --prompts ../shared/data/specbench_dev.jsonl --limit 24 \
        --out-json bench/results/cpu/prefix_cache_conversations_bf16.json

The conversations are Spec-Bench's two-turn questions (MT-bench) and its single-turn long-document ones
(summarization, rag) with a follow-up question about the same text. Two decoders of the same model and drafter,
one with the prefix cache and one without, take turns conversation by conversation (which goes first
alternates); each turn's time to first token (the prefill: a turn's first token comes from it), latency and
cached prompt tokens are recorded, and every answer is compared between the two.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

from specdec import SpecDecoder
from specdec.benchmarks.prompts import load_prompts, round_robin
from specdec.benchmarks.runner import machine_info
from specdec.config import GenerationConfig

DOCUMENT_CATEGORIES = ("summarization", "rag")
FOLLOW_UP = "Now list the three most important facts in the text above, one per line."


def conversations(path: str, limit: int) -> list[dict]:
    """Round-robin over categories: each conversation's category and turns (two)."""
    chosen = [p for p in load_prompts(path) if p.follow_ups or p.category in DOCUMENT_CATEGORIES]
    return [{"category": p.category, "question_id": p.question_id,
             "turns": [p.text, p.follow_ups[0] if p.follow_ups else FOLLOW_UP]} for p in round_robin(chosen, limit)]


def converse(decoder: SpecDecoder, turns: list[str], config: GenerationConfig) -> list[dict]:
    messages, out = [], []
    for turn in turns:
        messages.append({"role": "user", "content": turn})
        t0 = time.perf_counter()
        result = decoder.generate(messages, config)
        m = result.metrics
        out.append({"seconds": time.perf_counter() - t0, "prefill_s": m.prefill_time_s,
                    "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_prompt_tokens,
                    "tokens": result.token_ids})
        messages.append({"role": "assistant", "content": result.text})
    return out


def summarize(rows: list[list[dict]], turn: int) -> dict:
    picked = [r[turn] for r in rows]
    prompt, cached = sum(r["prompt_tokens"] for r in picked), sum(r["cached_tokens"] for r in picked)
    tokens, seconds = sum(len(r["tokens"]) for r in picked), sum(r["seconds"] for r in picked)
    return {"ttft_ms_mean": 1e3 * statistics.mean(r["prefill_s"] for r in picked),
            "ttft_ms_median": 1e3 * statistics.median(r["prefill_s"] for r in picked),
            "latency_s_mean": statistics.mean(r["seconds"] for r in picked),
            "prompt_tokens": prompt, "cached_tokens": cached, "cached_share": cached / prompt if prompt else 0.0,
            "tokens_per_s": tokens / seconds if seconds else 0.0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL")
    p.add_argument("--limit", type=int, default=24, help="conversations")
    p.add_argument("--model", default=None, help="default: the built-in default model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--backend", default="auto")
    p.add_argument("--drafter", default="ngram", help="both decoders' drafter (default: ngram, as the server's)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--entries", type=int, default=16, help="prefix cache entries (default: 16, as `specdec serve`)")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    chats = conversations(args.prompts, args.limit)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens)
    decoders = {mode: SpecDecoder.load(args.model, drafter=args.drafter, dtype=args.dtype, backend=args.backend)
                for mode in ("off", "on")}
    decoders["on"].enable_prefix_cache(args.entries)
    runs = {mode: [] for mode in decoders}
    for i, chat in enumerate(chats):
        for mode in (("off", "on") if i % 2 == 0 else ("on", "off")):
            runs[mode].append(converse(decoders[mode], chat["turns"], config))
    identical = [[a["tokens"] == b["tokens"] for a, b in zip(off, on)] for off, on in zip(runs["off"], runs["on"])]
    summary = {mode: {f"turn_{t + 1}": summarize(rows, t) for t in range(2)} for mode, rows in runs.items()}
    by_category = defaultdict(dict)
    for mode, rows in runs.items():
        for category in dict.fromkeys(c["category"] for c in chats):
            picked = [r for r, c in zip(rows, chats) if c["category"] == category]
            by_category[category][mode] = summarize(picked, 1)
    second = {mode: summary[mode]["turn_2"] for mode in runs}
    out = {"meta": {"command": "python bench/prefix_cache.py " + " ".join(
                        f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v is not None),
                    "machine": machine_info(), "conversations": len(chats),
                    "backend": decoders["on"].target.backend.__class__.__name__},
           "summary": summary,
           "turn_2_ttft_ratio_off_over_on": second["off"]["ttft_ms_mean"] / second["on"]["ttft_ms_mean"],
           "turn_2_latency_ratio_off_over_on": second["off"]["latency_s_mean"] / second["on"]["latency_s_mean"],
           "identical_answers": sum(all(x) for x in identical), "turn_2_by_category": by_category,
           "conversations": [{**c, "identical": same,
                              "turns_off": [{k: v for k, v in r.items() if k != "tokens"} for r in off],
                              "turns_on": [{k: v for k, v in r.items() if k != "tokens"} for r in on]}
                             for c, same, off, on in zip(chats, identical, runs["off"], runs["on"])]}
    with open(args.out_json, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=2)
    for mode in runs:
        for t in ("turn_1", "turn_2"):
            s = summary[mode][t]
            print(f"{mode:>3} {t}: TTFT {s['ttft_ms_mean']:6.1f} ms (median {s['ttft_ms_median']:6.1f}), latency "
                  f"{s['latency_s_mean']:.2f} s, cached {s['cached_tokens']}/{s['prompt_tokens']} prompt tokens, "
                  f"{s['tokens_per_s']:.1f} tok/s")
    print(f"turn 2 TTFT off/on {out['turn_2_ttft_ratio_off_over_on']:.2f}x, latency "
          f"{out['turn_2_latency_ratio_off_over_on']:.2f}x; identical conversations {out['identical_answers']}/"
          f"{len(chats)}")


if __name__ == "__main__":
    main()
