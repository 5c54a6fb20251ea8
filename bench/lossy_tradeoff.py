"""What LOSSY acceptance gains and costs, side by side in one run: MAT and tokens/s against exact decoding, the share
of tokens that differ from exact decoding's output, and agreement on GSM8K answers.

    python bench/lossy_tradeoff.py --gsm8k ../shared/data/train_prompts.jsonl --gsm8k-count 12 \\
        --specbench ../shared/data/specbench_dev.jsonl --specbench-count 8 --max-new-tokens 96 --dtype float32 \\
        --drafters eagle --acceptance exact,top-k:2,top-k:4,threshold:0.5,threshold:0.2,typical:0.3,typical:0.1 \\
        --out-json bench/results/cpu/lossy_tradeoff_bf16.json --plot docs/lossy_tradeoff.png

Every method runs every prompt greedily, interleaved prompt by prompt (specdec bench's runner): plain decoding
(`specdec:none`, exact decoding's output, the reference) and each drafter under each rule. GSM8K questions are the
first N of the train split in the file (source gsm8k*); they carry no reference answers here, so the task score is
the share of questions whose answer ends on the same number as exact decoding's (bench/tradeoff.py), not accuracy.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from specdec import SpecdecError
from specdec.benchmarks.prompts import BenchPrompt, load_prompts
from specdec.benchmarks.runner import SpecdecMethod, machine_info, run_methods
from specdec.benchmarks.tradeoff import method_name, summarize_tradeoff, tradeoff_chart
from specdec.cli.common import require_extra
from specdec.cli.drafting_options import acceptance_list
from specdec.speculation_config import SpeculationConfig
from specdec.errors import ConfigError


def gsm8k_prompts(path: str, count: int) -> list[BenchPrompt]:
    """The first `count` GSM8K questions of a JSONL file of {"source", "prompt"} lines."""
    found = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            row = json.loads(line) if line.strip() else {}
            if str(row.get("source", "")).startswith("gsm8k"):
                found.append(BenchPrompt(f"gsm8k-{len(found)}", "gsm8k", row["prompt"]))
                if len(found) == count:
                    return found
    raise ConfigError(f"{path} holds {len(found)} GSM8K questions, fewer than {count}")


def greedy_choices(hf_model, prompt_ids: list[int], output: list[int]) -> list[int]:
    """The target's argmax before each output token, the output read back in one pass: (len(output),) ids."""
    import torch

    with torch.inference_mode():
        logits = hf_model(input_ids=torch.tensor([prompt_ids + output], device=hf_model.device)).logits[0]
    return logits[len(prompt_ids) - 1: -1].argmax(-1).tolist()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gsm8k", required=True, help="JSONL of {source, prompt}; its gsm8k* lines are used")
    p.add_argument("--gsm8k-count", type=int, default=12)
    p.add_argument("--specbench", default=None, help="Spec-Bench JSONL (optional), picked round-robin by category")
    p.add_argument("--specbench-count", type=int, default=8)
    p.add_argument("--model", default=None, help="default: the built-in default model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backend", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    p.add_argument("--no-adaptive", action="store_true",
                   help="draft k every step (a tree drafter sizes its own tree), so that MAT and speed compare the "
                        "rules alone, not what the draft-length policy made of each one's measured costs")
    p.add_argument("--drafters", default="eagle", help="comma-separated drafters, each run under every rule")
    p.add_argument("--tree-nodes", type=int, default=None, metavar="N",
                   help="EAGLE and Medusa trees of N nodes whatever the measured costs (default: sized from them)")
    p.add_argument("--tree-width", type=int, default=None, metavar="W",
                   help="EAGLE and Medusa trees keep W candidates per level (default: chosen each step from the "
                        "measured costs, which a busy machine moves, and MAT with them)")
    p.add_argument("--acceptance", type=acceptance_list, default=["exact", "top-k:2", "threshold:0.3", "typical:0.2"],
                   help="comma-separated rules; exact is always run too (the speed reference)")
    p.add_argument("--out-json", required=True)
    p.add_argument("--plot", default=None, help="PNG of the trade-off against each rule's parameter")
    args = p.parse_args()
    if args.plot:
        require_extra("matplotlib", "bench", "--plot")  # before the run, not after it
    from specdec.drafters import create_drafter
    from specdec.engine import SpecDecoder
    from specdec.models.loading import load_model
    from specdec.models.registry import DEFAULT_MODEL
    from specdec.costs import CostModel, measure_verify_costs

    prompts = gsm8k_prompts(args.gsm8k, args.gsm8k_count)
    if args.specbench:
        prompts += [replace(q, question_id=f"specbench-{q.question_id}") for q in
                    load_prompts(args.specbench, args.specbench_count)]
    prompt_set = {q.question_id: q.category if q.category == "gsm8k" else "specbench" for q in prompts}
    rules = list(dict.fromkeys(["exact", *args.acceptance]))
    target = load_model(args.model or DEFAULT_MODEL, dtype=args.dtype, backend=args.backend)
    costs = CostModel(measure_verify_costs(target.backend))
    speculation = SpeculationConfig(num_speculative_tokens=args.num_speculative_tokens, adaptive=not args.no_adaptive)
    plain = SpecDecoder(target, None, speculation)
    methods, named = [SpecdecMethod("specdec:none", plain)], {"specdec:none": ("none", "exact")}
    for drafter in [d for d in args.drafters.split(",") if d]:
        for rule in rules:
            made = create_drafter(drafter, target, tree_nodes=args.tree_nodes, tree_width=args.tree_width)
            decoder = SpecDecoder(target, made, replace(speculation, acceptance=rule),
                                  costs=CostModel(costs.table))  # each its own drafting costs and policy
            decoder.warm_up()
            name = method_name("specdec", drafter, rule)
            methods.append(SpecdecMethod(name, decoder))
            named[name] = (drafter, rule)
    encoded = [(q, plain.encode(q.text)) for q in prompts]
    load_before = os.getloadavg()
    results = run_methods(methods, encoded, args.max_new_tokens)
    decode = target.tokenizer.decode
    texts = {name: {q: decode(run.tokens, skip_special_tokens=True) for q, run in result.runs.items()}
             for name, result in results.items()}
    ids_of = {q.question_id: ids for q, ids in encoded}
    greedy = {name: {q: greedy_choices(target.hf_model, ids_of[q], run.tokens) for q, run in result.runs.items()}
              for name, result in results.items()}
    summary = {"model": target.name, "dtype": args.dtype, "backend": type(target.backend).__name__,
               "max_new_tokens": args.max_new_tokens, "num_speculative_tokens": args.num_speculative_tokens,
               "adaptive": not args.no_adaptive, "tree_nodes": args.tree_nodes, "tree_width": args.tree_width,
               "prompt_sets": {s: list(prompt_set.values()).count(s) for s in sorted(set(prompt_set.values()))},
               "machine": machine_info(), "load_average_before_after": [load_before[0], os.getloadavg()[0]],
               "methods": summarize_tradeoff(results, named, prompt_set, texts, greedy),
               "outputs": {name: {q: run.tokens for q, run in r.runs.items()} for name, r in results.items()}}
    print(f"{'method':<32} {'MAT':>5} {'tok/s':>6} {'/exact':>6} {'differ':>7} {'after':>6} {'same':>6} {'GSM8K=':>6} "
          f"{'!greedy':>7}")
    for name, m in summary["methods"].items():
        gsm = m["final_number_agreement"]
        print(f"{name:<32} {m['mean_accepted_tokens']:>5.2f} {m['tokens_per_s']:>6.1f} {m['speed_over_exact']:>6.2f} "
              f"{m['token_mismatch_share']:>7.1%} {m['diverged_share']:>6.1%} {m['identical']:>3}/{m['prompts']:<2} "
              f"{'-' if gsm is None else f'{gsm:.0%}':>6} {m['off_greedy_share']:>7.1%}")
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(summary, indent=1), encoding="utf-8")
    print(f"wrote {args.out_json}", file=sys.stderr)
    if args.plot:
        print(f"wrote {tradeoff_chart(summary, args.plot)}", file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except SpecdecError as exc:
        raise SystemExit(f"lossy_tradeoff: {exc}") from None
