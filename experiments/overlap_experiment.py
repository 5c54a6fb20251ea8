"""Does drafting overlapped with verification pay on this CPU? Two measurements in one run (docs/experiments/overlap.md):

1. Parts: a target verify pass of 1 + k tokens with 2 threads and with 1, an EAGLE chain of k with 2 threads and
   with 1, and both at once (the target on the main thread, the chain in a worker, one thread each).
2. End to end, greedy, interleaved prompt by prompt: plain decoding, the EAGLE chain drafter, and the same chain
   pipelined (experiments/pipelined.py: the next chain drafted in a worker thread during the verify pass):
   tokens/s, MAT, how often the work ahead was used, and token equality with plain decoding.

    OMP_WAIT_POLICY=PASSIVE python experiments/overlap_experiment.py --specbench ../shared/data/specbench_dev.jsonl \\
        --prompts 6 --max-new-tokens 64 -k 4 --out-json experiments/results/overlap_cpu_avx2.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import reduce
from pathlib import Path

import torch

from specdec.benchmarks.prompts import load_prompts
from specdec.benchmarks.runner import SpecdecMethod, machine_info, run_methods
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.base import Budget, DraftRequest
from pipelined import PipelinedChain
from specdec.engine import SpecDecoder
from specdec.metrics import GenerationMetrics
from specdec.models.loading import load_model
from specdec.models.registry import DEFAULT_MODEL
from specdec.costs import CostModel, measure_verify_costs


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


@torch.inference_mode()
def parts(target, drafter, prompt_ids: list[int], k: int, repeats: int) -> dict:
    """Median milliseconds of the step's two parts, apart, with 2 and 1 threads, and overlapped."""
    backend = target.backend
    cache = backend.new_cache()
    out = backend.forward(cache, torch.tensor(prompt_ids), output_hidden=True)
    context = prompt_ids + [int(out.logits[-1].argmax())]
    drafter.begin(DraftRequest(prompt_ids=prompt_ids))
    drafter.observe(out.hidden)
    rows = torch.tensor(context[-1:] + drafter.propose(context, Budget(k)).tokens.tolist())  # (1 + k,)

    def verify():
        backend.forward(cache, rows, output_hidden=True)
        backend.truncate(cache, len(context) - 1)

    def draft():
        drafter.propose(context, Budget(k))

    threads = torch.get_num_threads()
    figures = {}
    for n in sorted({threads, 1}, reverse=True):
        torch.set_num_threads(n)
        figures[f"verify_ms_{n}_threads"] = median_ms(verify, repeats)
        figures[f"draft_ms_{n}_threads"] = median_ms(draft, repeats)
    torch.set_num_threads(1)
    pool = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,))
    pool.submit(draft).result()  # the worker's first call pays its start-up

    def timed_draft():
        t0 = time.perf_counter()
        with torch.inference_mode():
            draft()
        return time.perf_counter() - t0

    windows, verifies, drafts = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        future = pool.submit(timed_draft)
        verify()
        t1 = time.perf_counter()
        drafts.append(future.result())
        windows.append(time.perf_counter() - t0)
        verifies.append(t1 - t0)
    pool.shutdown()
    torch.set_num_threads(threads)
    figures.update(overlapped_window_ms=1e3 * statistics.median(windows),
                   overlapped_verify_ms=1e3 * statistics.median(verifies),
                   overlapped_draft_ms=1e3 * statistics.median(drafts))
    backend.release(cache)
    drafter.end()
    return figures


def end_to_end(methods: dict, prompts: list, max_new_tokens: int) -> dict:
    """Every method on every prompt, the order rotating from prompt to prompt (specdec bench's runner)."""
    timed = [SpecdecMethod(name, decoder) for name, decoder in methods.items()]
    for method in timed:  # first calls pay for allocations
        method.run(prompts[0][1], 8)
        if isinstance(method.decoder.drafter, PipelinedChain):  # its counts cover the timed runs only
            method.decoder.drafter.hits = method.decoder.drafter.launched = 0
    results = run_methods(timed, prompts, max_new_tokens, warm_up=False)
    plain = results["plain"].runs
    summary = {}
    for name, result in results.items():
        runs = result.runs
        total = reduce(GenerationMetrics.merge, [r.metrics for r in runs.values()])
        tokens = sum(len(r.tokens) for r in runs.values())
        seconds = sum(r.seconds for r in runs.values())
        summary[name] = {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
                         "mean_accepted_tokens": total.mean_accepted_tokens, "steps": total.steps,
                         "drafting_steps": total.drafting_steps, "draft_time_s": total.draft_time_s,
                         "verify_time_s": total.verify_time_s,
                         "identical_to_plain": sum(r.tokens == plain[q].tokens for q, r in runs.items()),
                         "prompts": len(runs)}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--specbench", required=True, help="Spec-Bench JSONL, picked round-robin by category")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--model", default=None, help="default: the built-in default model")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("-k", type=int, default=4, help="chain length, every step (no adaptive policy)")
    p.add_argument("--repeats", type=int, default=30, help="repeats per timed part")
    p.add_argument("--skip-end-to-end", action="store_true")
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    load_before = os.getloadavg()
    target = load_model(args.model or DEFAULT_MODEL, dtype=args.dtype)
    plain = SpecDecoder(target, None)
    prompts = [(q, plain.encode(q.text)) for q in load_prompts(args.specbench, args.prompts)]
    chain = create_drafter("eagle", target, tree=False)
    result = {"model": target.name, "dtype": args.dtype, "backend": type(target.backend).__name__, "k": args.k,
              "max_new_tokens": args.max_new_tokens, "machine": machine_info(),
              "parts": parts(target, chain, prompts[0][1], args.k, args.repeats)}
    print(json.dumps(result["parts"], indent=1), file=sys.stderr)
    if not args.skip_end_to_end:
        costs = measure_verify_costs(target.backend)
        fixed = SpeculationConfig(num_speculative_tokens=args.k, adaptive=False)
        piped = PipelinedChain(create_drafter("eagle", target, tree=False))
        methods = {"plain": plain,
                   "eagle-chain": SpecDecoder(target, chain, fixed, costs=CostModel(costs)),
                   "eagle-chain-pipelined": SpecDecoder(target, piped, fixed, costs=CostModel(costs))}
        result["end_to_end"] = end_to_end(methods, prompts, args.max_new_tokens)
        result["end_to_end"]["eagle-chain-pipelined"].update(work_ahead_used=piped.hits, verify_passes=piped.launched)
        piped.close()
    result["load_average_before_after"] = [load_before[0], os.getloadavg()[0]]
    result["loaded"] = max(result["load_average_before_after"]) > 2.5
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(json.dumps(result.get("end_to_end"), indent=1))
    print(f"wrote {args.out_json}", file=sys.stderr)


if __name__ == "__main__":
    main()
