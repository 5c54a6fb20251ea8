"""`specdec bench`: transformers' generate, its prompt lookup and assisted generation, and specdec's
methods, run greedy on the same prompts in one process, interleaved prompt by prompt."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache, reduce
from pathlib import Path

import torch

from ..config import GenerationConfig
from ..metrics import GenerationMetrics
from ..tokens import first_difference
from .prompts import BenchPrompt
from .tradeoff import differences

BASELINE = "hf_generate"


@dataclass
class PromptRun:
    tokens: list[int]
    seconds: float
    metrics: GenerationMetrics | None = None


@dataclass
class MethodResult:
    name: str
    runs: dict[str, PromptRun] = field(default_factory=dict)  # question_id -> run


class HFMethod:
    """transformers' own generate, greedy, with optional speculation arguments."""

    def __init__(self, name: str, hf_model, **generate_kwargs):
        self.name, self.model, self.kwargs = name, hf_model, generate_kwargs

    @torch.inference_mode()
    def run(self, prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        device = self.model.device
        ids = torch.tensor([prompt_ids], device=device)
        pad = self.model.generation_config.pad_token_id
        start = time.perf_counter()
        out = self.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            **self.kwargs,
        )
        seconds = time.perf_counter() - start
        return PromptRun(tokens=out[0, len(prompt_ids) :].tolist(), seconds=seconds)


class SpecdecMethod:
    """specdec's engine with one drafter (or none); repetition_penalty as transformers' (1: off)."""

    def __init__(self, name: str, decoder, repetition_penalty: float = 1.0):
        self.name, self.decoder, self.repetition_penalty = name, decoder, repetition_penalty

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        start = time.perf_counter()
        config = GenerationConfig.create(max_new_tokens=max_new_tokens, repetition_penalty=self.repetition_penalty)
        tokens, metrics = self.decoder.generate_ids(prompt_ids, config)
        return PromptRun(tokens=tokens, seconds=time.perf_counter() - start, metrics=metrics)


def run_methods(
    methods,
    prompts: list[tuple[BenchPrompt, list[int]]],
    max_new_tokens: int,
    progress: bool = True,
    warm_up: bool = True,
) -> dict[str, MethodResult]:
    """Runs every method on every prompt; the order of methods rotates from prompt to prompt. warm_up: first one
    short untimed run each (False where the caller warmed them up itself)."""
    from tqdm.auto import tqdm

    results = {m.name: MethodResult(m.name) for m in methods}
    for m in methods if warm_up else ():  # first calls pay for allocations and kernel selection
        m.run(prompts[0][1], min(8, max_new_tokens))
    bar = tqdm(total=len(prompts) * len(methods), desc="bench", disable=not progress, file=sys.stderr)
    for i, (prompt, ids) in enumerate(prompts):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        for m in order:
            results[m.name].runs[prompt.question_id] = m.run(ids, max_new_tokens)
            bar.update(1)
    bar.close()
    return results


@torch.inference_mode()
def top2_gap(hf_model, prompt_ids: list[int], prefix: list[int]) -> float:
    """The target's gap between its two largest logits after prompt + prefix (its own greedy tokens)."""
    ids = torch.tensor([prompt_ids + prefix], device=hf_model.device)
    logits = hf_model(input_ids=ids, logits_to_keep=1).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def reference_tokens(
    hf_model, prompts: list[tuple[BenchPrompt, list[int]]], max_new_tokens: int, **generate_kwargs
) -> dict[str, list[int]]:
    """Greedy tokens of transformers' generate for each prompt (untimed), e.g. from a float32 copy."""
    method = HFMethod("reference", hf_model, **generate_kwargs)
    return {p.question_id: method.run(ids, max_new_tokens).tokens for p, ids in prompts}


def summarize(
    results: dict[str, MethodResult],
    prompts: list[tuple[BenchPrompt, list[int]]],
    hf_model,
    meta: dict,
    reference: dict[str, list[int]] | None = None,
    plain_of: dict[str, str] | None = None,
) -> dict:
    """The benchmark JSON: per method throughput, speedup over hf_generate, MAT, equality, divergences, and its
    acceptance rule ("lossy": true for a lossy one). identical_to_specdec_none counts prompts equal to the same
    engine's plain decoding: specdec:none for specdec's methods, and plain_of[name] for other engines' (e.g.
    llamacpp for llamacpp_lookup); differs_from_plain measures how far the outputs are from it (tradeoff.py)."""
    base = results[BASELINE]
    by_id = {p.question_id: (p, ids) for p, ids in prompts}
    categories = sorted({p.category for p, _ in prompts})

    def throughput(result: MethodResult, ids: list[str]) -> float:
        tokens = sum(len(result.runs[q].tokens) for q in ids)
        seconds = sum(result.runs[q].seconds for q in ids)
        return tokens / seconds if seconds else 0.0

    def merged(result: MethodResult, ids: list[str]) -> GenerationMetrics | None:
        ms = [m for q in ids if (m := result.runs[q].metrics) is not None]
        return reduce(GenerationMetrics.merge, ms) if ms else None

    def step_figures(total: GenerationMetrics | None) -> dict:
        """MAT over every verify step, and the mean acceptance length over drafting steps only (vLLM's)."""
        return {
            "mean_accepted_tokens": total and total.mean_accepted_tokens,
            "mean_acceptance_length": total and total.mean_acceptance_length,
        }

    all_ids = [p.question_id for p, _ in prompts]
    out = dict(meta)
    out["prompts"] = len(prompts)
    out["methods"] = {}
    for name, result in results.items():
        none = (
            results.get(name.split(":")[0] + ":none")
            if name.startswith("specdec")
            else results.get((plain_of or {}).get(name, ""))
        )
        divergences = []
        identical = 0
        for q in all_ids:
            pos = first_difference(result.runs[q].tokens, base.runs[q].tokens)
            if pos is None:
                identical += 1
                continue
            prompt, ids = by_id[q]
            baseline = base.runs[q].tokens
            gap = top2_gap(hf_model, ids, baseline[:pos]) if pos < len(baseline) else None
            divergences.append({"question_id": q, "category": prompt.category, "position": pos, "logit_gap": gap})
        measured = merged(result, all_ids)
        totals = measured or GenerationMetrics()
        tps = throughput(result, all_ids)
        entry = {
            "tokens_per_s": tps,
            "speedup": tps / throughput(base, all_ids),
            **step_figures(measured),
            "acceptance_rate": totals.acceptance_rate,
            "per_position_acceptance": totals.per_position_acceptance or None,
            "identical": identical,
            "total": len(all_ids),
            "acceptance": totals.acceptance,
            "lossy": totals.lossy,
            "identical_to_specdec_none": None
            if none is None
            else sum(  # same backend's plain decoding
                result.runs[q].tokens == none.runs[q].tokens for q in all_ids
            ),
            "differs_from_plain": None
            if none is None
            else differences([result.runs[q].tokens for q in all_ids], [none.runs[q].tokens for q in all_ids]),
            "identical_to_reference": None
            if reference is None
            else sum(result.runs[q].tokens == reference[q] for q in all_ids),
            "steps": totals.steps,
            "drafting_steps": totals.drafting_steps,
            "draft_time_s": totals.draft_time_s,
            "verify_time_s": totals.verify_time_s,
            **drafting_cost(totals, plain_pass_s(merged(none, all_ids) if none is not None else None)),
            **({"drafter_steps": totals.drafter_steps} if totals.drafter_steps else {}),  # the select drafter's choices
            "tokens": sum(len(result.runs[q].tokens) for q in all_ids),
            "seconds": sum(result.runs[q].seconds for q in all_ids),
            "per_category": {},
            "divergences": divergences,
        }
        for c in categories:
            ids_c = [p.question_id for p, _ in prompts if p.category == c]
            entry["per_category"][c] = {
                "speedup": throughput(result, ids_c) / throughput(base, ids_c),
                **step_figures(merged(result, ids_c)),
                "tokens_per_s": throughput(result, ids_c),
            }
        out["methods"][name] = entry
    return out


def plain_pass_s(plain: GenerationMetrics | None) -> float | None:
    """The mean one-token pass of a plain decoding run, from its merged metrics (its verify seconds over its
    steps), or None."""
    return plain.verify_time_s / plain.steps if plain is not None and plain.steps else None


def drafting_cost(totals: GenerationMetrics, one_pass_s: float | None) -> dict:
    """What a drafted token cost: the drafting seconds over the tokens drafted, and that over the target's one-token
    pass measured in the same run (plain_pass_s): what a drafter must stay well below to pay."""
    per_token = totals.draft_time_s / totals.drafted_tokens if totals.drafted_tokens else None
    return {
        "drafted_tokens": totals.drafted_tokens,
        "draft_s_per_drafted_token": per_token,
        "drafted_token_over_target_pass": per_token / one_pass_s if per_token is not None and one_pass_s else None,
    }


@lru_cache(maxsize=1)
def commit() -> str | None:
    """The checkout's commit (git), else SPECDEC_COMMIT (a copy of the tree with no .git, e.g. on a GPU machine):
    read once, as this module is imported (below), so that a result names the code that ran, not a commit made in
    the same checkout while a long benchmark was running."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True, text=True, timeout=10
        )
        if done.returncode == 0 and done.stdout.strip():
            return done.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return os.environ.get("SPECDEC_COMMIT") or None


commit()


def stamp() -> dict:
    """When and on which commit a result is measured: {"date": UTC, ISO 8601, "commit": commit()}."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": commit()}


def machine_info() -> dict:
    from ..kernels import cpu_flags

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "platform": platform.platform(),
        "cpu_features": sorted(cpu_flags() & {"avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16"}),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }


def cpu_model() -> str | None:
    """The CPU's model name as /proc/cpuinfo gives it (None elsewhere)."""
    try:
        text = open("/proc/cpuinfo", encoding="utf-8").read()
    except OSError:
        return None
    names = [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")]
    return names[0] if names else None
