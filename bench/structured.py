"""Speculation under structured output: Spec-Bench prompts answered as JSON that follows a schema.

    python bench/structured.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 --dtype bfloat16 \
        --out-json bench/results/cpu/structured_json_schema_bf16.json

Every prompt gets an instruction to reply in JSON with the schema's fields, and every method decodes it greedily
under the schema (llguidance masks, see specdec/structured.py); the methods take turns prompt by prompt, and
each is compared with plain constrained decoding (`none`): tokens per second, MAT, identical outputs.
With a drafter, the tokens the schema forces (keys, quotes, separators) are drafted first (jump-forward).
With --tool-call, each prompt is answered by required calls of two tools (the server's tool_choice "required",
parallel calls allowed: the tools described in the system message, a JSON array of one or more calls constrained
to their schemas).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

from specdec import SpecDecoder, SpecdecError
from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import machine_info
from specdec.config import Constraint, GenerationConfig
from specdec.server.tools import parse_tool_calling

SCHEMA = {"type": "object", "additionalProperties": False,
          "required": ["answer", "topic", "keywords", "confident"],
          "properties": {"answer": {"type": "string", "maxLength": 600}, "topic": {"type": "string", "maxLength": 60},
                         "keywords": {"type": "array", "items": {"type": "string", "maxLength": 40}, "maxItems": 5},
                         "confident": {"type": "boolean"}}}
INSTRUCTION = "\n\nReply in JSON with the fields answer, topic, keywords (at most five) and confident (true or false)."
TOOLS = [{"type": "function", "function": {"name": "search_web", "description": "Search the web for pages on a topic",
                                           "parameters": {"type": "object", "properties": {
                                               "query": {"type": "string", "maxLength": 200},
                                               "max_results": {"type": "integer", "minimum": 1, "maximum": 20}},
                                               "required": ["query", "max_results"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "reply", "description": "Answer the user directly",
                                           "parameters": {"type": "object", "properties": {
                                               "answer": {"type": "string", "maxLength": 600},
                                               "topic": {"type": "string", "maxLength": 60}},
                                               "required": ["answer", "topic"], "additionalProperties": False}}}]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", required=True, help="Spec-Bench JSONL")
    p.add_argument("--limit", type=int, default=26)
    p.add_argument("--model", default=None, help="default: the built-in default model")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--max-new-tokens", type=int, default=192, help="room for most answers to close their JSON")
    p.add_argument("--drafters", default="none,ngram,suffix,eagle", help="the first is the reference")
    p.add_argument("--tool-call", action="store_true",
                   help="answer each prompt with required calls of TOOLS (the server's tool_choice "
                        "\"required\": tools described in the system message, the call constrained) instead of JSON")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    prompts = load_prompts(args.prompts, args.limit)
    calling = parse_tool_calling({"tools": TOOLS, "tool_choice": "required"}, None, None) if args.tool_call else None
    constraint = calling.constraint() if calling else Constraint.json_schema(SCHEMA)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, constraint=constraint)
    names = args.drafters.split(",")
    decoders = {name: SpecDecoder.load(args.model, drafter=name, dtype=args.dtype) for name in names}
    first = decoders[names[0]]
    encoded = [first.encode(calling.messages([{"role": "user", "content": q.text}], False)[0]) if calling
               else first.encode(q.text + INSTRUCTION) for q in prompts]
    for decoder in decoders.values():  # warm-up: the first call builds llguidance's tokenizer and allocations
        decoder.generate_ids(encoded[0], GenerationConfig(max_new_tokens=8, constraint=config.constraint))
    runs = {name: [] for name in names}
    for i, ids in enumerate(encoded):
        for name in names[i % len(names):] + names[: i % len(names)]:
            t0 = time.perf_counter()
            tokens, metrics = decoders[name].generate_ids(ids, config)
            runs[name].append({"seconds": time.perf_counter() - t0, "tokens": tokens, "steps": metrics.steps})
    summary = {}
    for name, rows in runs.items():
        n, seconds = sum(len(r["tokens"]) for r in rows), sum(r["seconds"] for r in rows)
        steps = sum(r["steps"] for r in rows)
        by_category = defaultdict(list)
        for q, row in zip(prompts, rows):
            by_category[q.category].append(len(row["tokens"]) / row["seconds"])
        summary[name] = {"tokens_per_s": round(n / seconds, 1), "mat": round(n / steps, 2),
                         "identical_to_" + names[0]: sum(r["tokens"] == ref["tokens"]
                                                         for r, ref in zip(rows, runs[names[0]])),
                         "valid_json": sum(_parses(decoders[name], r["tokens"]) for r in rows),
                         "tokens_per_s_by_category": {c: round(statistics.mean(v), 1)
                                                      for c, v in sorted(by_category.items())}}
        row = summary[name]
        print(f"{name:8s} {row['tokens_per_s']:6.1f} tok/s  MAT {row['mat']:.2f}  identical "
              f"{row['identical_to_' + names[0]]}/{len(rows)}  valid JSON {row['valid_json']}", flush=True)
    base = summary[names[0]]["tokens_per_s"]
    for row in summary.values():
        row["speedup_over_" + names[0]] = round(row["tokens_per_s"] / base, 2)
    meta = {"prompts": args.prompts, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "dtype": args.dtype,
            "schema": SCHEMA if calling is None else None, "instruction": INSTRUCTION if calling is None else None,
            "tool_call": TOOLS if calling else None, "question_ids": [q.question_id for q in prompts],
            "machine": machine_info()}
    with open(args.out_json, "w") as f:
        json.dump({"meta": meta, "summary": summary,
                   "runs": {k: [{**r, "seconds": round(r["seconds"], 4)} for r in v] for k, v in runs.items()}}, f)


def _parses(decoder: SpecDecoder, tokens: list[int]) -> bool:
    """Whether a finished output is JSON (an output cut at max_new_tokens is not)."""
    try:
        json.loads(decoder.target.tokenizer.decode(tokens, skip_special_tokens=True))
        return True
    except ValueError:
        return False


if __name__ == "__main__":
    try:
        main()
    except SpecdecError as exc:
        raise SystemExit(f"structured: {exc}") from None
