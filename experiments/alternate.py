"""Methods alternated prompt by prompt in one process, so that a busy spell on a shared machine falls on all of them:
the loop of the A/B scripts in experiments/ (an ISA build, VNNI against none, the copy's attention by pieces of keys)."""
from __future__ import annotations

import time


def alternate(decoder, prompts, config, methods: dict, each=None) -> tuple[dict[str, dict], int]:
    """Runs every method on every prompt, the order rotating by one each prompt. methods: name -> the drafter
    `decoder.complete` takes (a DrafterChoice: PLAIN, OWN_DRAFTER or DrafterChoice(a drafter)), or a pair
    (another decoder, its drafter). each(prompt, outputs): called after each prompt with {name: tokens}. Returns per
    method its totals (tokens, seconds, steps, draft_s, tokens_per_s, mean_accepted_tokens) and the number of prompts
    whose outputs were the same for every method."""
    names = list(methods)
    runs = {name: method if isinstance(method, tuple) else (decoder, method) for name, method in methods.items()}
    totals = {name: {"tokens": 0, "seconds": 0.0, "steps": 0, "draft_s": 0.0} for name in names}
    equal = 0
    for i, prompt in enumerate(prompts):
        outputs = {}
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            runner, drafter = runs[name]
            ids = runner.encode(prompt.text)
            start = time.perf_counter()
            state = runner.complete(ids, config, drafter=drafter)
            total = totals[name]
            total["seconds"] += time.perf_counter() - start
            total["tokens"] += len(state.generated)
            total["steps"] += state.metrics.steps
            total["draft_s"] += state.metrics.draft_time_s
            outputs[name] = list(state.generated)
        equal += all(out == outputs[names[0]] for out in outputs.values())
        if each is not None:
            each(prompt, outputs)
    for total in totals.values():
        total["tokens_per_s"] = total["tokens"] / total["seconds"]
        total["mean_accepted_tokens"] = total["tokens"] / max(1, total["steps"])
    return totals, equal


def named_copy(target, copy, name: str, split_attention: bool | None = None, module=None, passes=None):
    """The quantized copy drafter under its own name (so that each keeps its own measured drafting cost).
    split_attention: module.set_split_attention's setting around its passes (module: the kernels build); None: as
    built. passes: the copy's pass costs, shared with forks (None: measured now)."""
    from specdec.drafters.quantized import QuantizedCopyDrafter

    class NamedCopy(QuantizedCopyDrafter):
        def fork(self):
            return named_copy(self.target, self.copy, name, split_attention, module, self.passes)

        def _passes(self, caches, starts, feeds):
            if split_attention is None:
                return super()._passes(caches, starts, feeds)
            was = module.set_split_attention(split_attention)
            try:
                return super()._passes(caches, starts, feeds)
            finally:
                module.set_split_attention(was)

    drafter = NamedCopy(target, copy, passes=passes)
    drafter.name = name
    return drafter


def ab_arguments(description: str):
    """The A/B scripts' command line: --prompts, --limit, --dtype, --max-new-tokens, --out-json (parsed)."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=26)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out-json", required=True)
    return parser.parse_args()


def copy_ab(args, decoder, drafters: dict) -> dict:
    """Plain decoding and each drafter (name -> drafter, warmed up here) alternated prompt by prompt; writes and
    returns the result: totals per method, prompts equal for all, each drafter's speed-up over plain decoding."""
    import json
    from pathlib import Path

    from specdec.benchmarks.prompts import load_prompts
    from specdec.benchmarks.runner import machine_info
    from specdec.choice import PLAIN, DrafterChoice
    from specdec.config import GenerationConfig

    for drafter in drafters.values():
        decoder.warm_up(drafter=drafter)
    prompts = load_prompts(args.prompts, args.limit)
    totals, equal = alternate(decoder, prompts, GenerationConfig(max_new_tokens=args.max_new_tokens),
                              {"none": PLAIN, **{name: DrafterChoice(d) for name, d in drafters.items()}})
    speedup = {name: totals[name]["tokens_per_s"] / totals["none"]["tokens_per_s"] for name in drafters}
    result = {"dtype": args.dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "equal_to_plain": equal, "speedup_over_none": speedup, "methods": totals, "machine": machine_info()}
    Path(args.out_json).write_text(json.dumps(result, indent=1))
    return result
