"""What speculation could gain on this machine with a drafter of a given quality: an oracle drafter's speed.

The oracle knows the target's greedy output for each prompt (from a plain run first) and drafts its next tokens,
each one right with probability p given that those before it were (a wrong one is replaced by another token, and
the chain goes on after it, as a real drafter's would, so verification pays for every drafted token). It costs
nothing to draft unless `--draft-ms` simulates a drafter's time per drafted position (a busy wait). The engine's
policy sizes the chains from the measured verify costs as it does for real drafters (`--no-adaptive`: k every
step). Every method runs prompt by prompt, interleaved with plain decoding, and must equal plain decoding.

    python bench/oracle_ceiling.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 --dtype bfloat16 \
        --accept 0.45,0.6,0.75,0.9,1.0 --out-json bench/results/cpu/oracle_ceiling_bf16.json

The figures say how good a drafter must be for a given speed-up here, and how far the best one is from it.
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import PromptRun, SpecdecMethod, machine_info, run_methods
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget, Drafter, DraftRequest
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model
from specdec.models.registry import DEFAULT_MODEL
from specdec.costs import CostModel, measure_verify_costs
from specdec.verify import Draft


class OracleDrafter(Drafter):
    """Drafts the known greedy continuation, each token right with probability `accept` given the ones before."""

    name = "oracle"

    def __init__(self, references: dict[tuple[int, ...], list[int]], accept: float, draft_s: float, vocab: int,
                 seed: int = 0):
        self.references, self.accept, self.draft_s, self.vocab, self.seed = references, accept, draft_s, vocab, seed

    def begin(self, request: DraftRequest) -> None:
        super().begin(request)
        self.prompt_len = len(request.prompt_ids)
        self.reference = self.references[tuple(request.prompt_ids)]
        self.rng = random.Random(hash((self.seed, len(request.prompt_ids), tuple(request.prompt_ids[-8:]))))

    def propose(self, context: list[int], budget: Budget) -> Draft:
        done = len(context) - self.prompt_len
        upcoming = self.reference[done:done + budget.k]
        tokens, right = [], True
        for token in upcoming:
            right = right and self.rng.random() < self.accept
            tokens.append(token if right else (token + 1) % self.vocab)
        if self.draft_s and tokens:
            until = time.perf_counter() + self.draft_s * len(tokens)
            while time.perf_counter() < until:
                pass
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long))

    def fork(self) -> "OracleDrafter":
        return OracleDrafter(self.references, self.accept, self.draft_s, self.vocab, self.seed)


def totals(runs: dict[str, PromptRun]) -> dict:
    """Tokens per second over all prompts, MAT over all steps, and the share of drafted tokens accepted."""
    tokens = sum(len(r.tokens) for r in runs.values())
    seconds = sum(r.seconds for r in runs.values())
    steps = sum(r.metrics.steps for r in runs.values() if r.metrics)
    step_tokens = sum(r.metrics.step_tokens for r in runs.values() if r.metrics)
    drafted = sum(r.metrics.drafted_tokens for r in runs.values() if r.metrics)
    accepted = sum(r.metrics.accepted_tokens for r in runs.values() if r.metrics)
    drafting = sum(r.metrics.drafting_steps for r in runs.values() if r.metrics)
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "mat": step_tokens / steps if steps else None, "acceptance_rate": accepted / drafted if drafted else None,
            "drafting_steps": drafting, "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--accept", default="0.45,0.6,0.75,0.9,1.0", help="per-token acceptances, comma-separated")
    parser.add_argument("--draft-ms", type=float, default=0.0, help="simulated drafting time per drafted position")
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    parser.add_argument("--no-adaptive", action="store_true", help="draft k tokens every step")
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()
    accepts = [float(a) for a in args.accept.split(",") if a.strip()]
    if not accepts or any(not 0.0 <= a <= 1.0 for a in accepts):
        parser.error("--accept takes probabilities in [0, 1]")

    target = load_model(DEFAULT_MODEL, dtype=args.dtype)
    plain = SpecDecoder(target, None)
    prompts = [(p, plain.encode(p.text)) for p in load_prompts(args.prompts, args.limit)]
    config = GenerationConfig.create(max_new_tokens=args.max_new_tokens)
    references = {tuple(ids): plain.generate_ids(ids, config)[0] for _, ids in prompts}

    speculation = SpeculationConfig(num_speculative_tokens=args.num_speculative_tokens, adaptive=not args.no_adaptive)
    table = measure_verify_costs(target.backend)
    vocab = target.info.vocab_size
    methods = [SpecdecMethod("none", SpecDecoder(target, None, speculation))]
    for accept in accepts:
        drafter = OracleDrafter(references, accept, args.draft_ms / 1000, vocab)
        decoder = SpecDecoder(target, drafter, speculation, costs=CostModel(table))
        methods.append(SpecdecMethod(f"oracle@{accept:g}", decoder))
    results = run_methods(methods, prompts, args.max_new_tokens)

    none = totals(results["none"].runs)
    report = {"model": DEFAULT_MODEL, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens,
              "prompt_file": args.prompts, "limit": args.limit, "draft_ms": args.draft_ms,
              "num_speculative_tokens": args.num_speculative_tokens, "adaptive": not args.no_adaptive,
              "verify_costs_s": table, "machine": machine_info(), "methods": {}}
    for name, result in results.items():
        row = totals(result.runs)
        row["speedup_over_none"] = row["tokens_per_s"] / none["tokens_per_s"]
        row["equal_to_plain"] = sum(result.runs[p.question_id].tokens == references[tuple(ids)] for p, ids in prompts)
        report["methods"][name] = row
        mat = f"{row['mat']:.2f}" if row["mat"] else "-"
        print(f"{name:14s} {row['tokens_per_s']:7.1f} tok/s  {row['speedup_over_none']:.2f}x  MAT {mat}  "
              f"equal {row['equal_to_plain']}/{len(prompts)}")
    if args.out_json:
        tmp = args.out_json.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1))
        tmp.replace(args.out_json)


if __name__ == "__main__":
    main()
