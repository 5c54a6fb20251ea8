"""A serving benchmark's figures (loadgen.py's runs): each run's throughput, latency distributions, goodput and
speculation statistics, the long prompts of a mixed run, and the floors over all runs (rounds pooled)."""

from __future__ import annotations

import statistics
from dataclasses import asdict

from .loadgen import MODES, RequestResult
from .serve_profile import pooled_pass_share


def summarize(
    concurrency: int,
    mode: str,
    wall: float,
    results: list[RequestResult],
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict:
    """One run's figures: aggregate tokens/s, TTFT, inter-token latency (every gap between content chunks of
    every request, pooled), time per output token and latency distributions, goodput under the latency targets
    given (requests a second that met them; None without a target), speculation, failures."""
    ok = [r for r in results if r.status == "ok"]
    good = (
        sum(r.meets(slo_ttft_s, slo_tpot_s) for r in results)
        if slo_ttft_s is not None or slo_tpot_s is not None
        else None
    )
    tokens = sum(r.completion_tokens for r in ok)
    drafted, accepted = sum(r.drafted_tokens for r in ok), sum(r.accepted_tokens for r in ok)
    steps, drafting_steps = sum(r.verify_steps for r in ok), sum(r.drafting_steps for r in ok)
    return {
        "concurrency": concurrency,
        "speculation": mode,
        "requests": len(results),
        "ok": len(ok),
        "failed": sum(r.status == "failed" for r in results),
        "lost": sum(r.status == "lost" for r in results),
        "wall_s": wall,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "completion_tokens": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_s": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_s": _dist([gap for r in ok for gap in r.chunk_gaps_s]),
        "tpot_s": _dist([r.tpot_s for r in ok if r.tpot_s is not None]),
        "latency_s": _dist([r.latency_s for r in ok]),
        "goodput": {
            "slo_ttft_s": slo_ttft_s,
            "slo_tpot_s": slo_tpot_s,
            "requests_met": good,
            "requests_per_s": good / wall if good is not None and wall > 0 else None,
        },
        "acceptance_rate": accepted / drafted if drafted else None,
        "mean_accepted_tokens": sum(r.step_tokens for r in ok) / steps if steps else None,
        "mean_acceptance_length": 1.0 + accepted / drafting_steps if drafting_steps else None,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "errors": sorted({r.error for r in results if r.error})[:5],
        "per_request": [asdict(r) for r in results],
    }


def summarize_long(results: list[RequestResult]) -> dict:
    """The long prompts of a mixed run: how many were sent and answered, their prompt tokens and TTFT."""
    ok = [r for r in results if r.status == "ok"]
    return {
        "sent": len(results),
        "ok": len(ok),
        "failed": sum(r.status == "failed" for r in results),
        "lost": sum(r.status == "lost" for r in results),
        "prompt_tokens": _dist([float(r.prompt_tokens) for r in ok]),
        "ttft_s": _dist([r.ttft_s for r in ok if r.ttft_s is not None]),
    }


def floors(runs: list[dict]) -> dict:
    """The serving floors, measured: throughput scaling without speculation, failures, latency gain at c=1, and
    speculation on over off at each concurrency. Repeated runs of one (concurrency, speculation) are pooled: their
    tokens over their seconds, their latencies weighted by requests."""

    def pooled(c, mode):
        same = _runs(runs, c, mode, long_prompts=False)
        wall = sum(r["wall_s"] for r in same)
        if not same or wall <= 0:
            return None
        timed = [r for r in same if r["latency_s"]["mean"]]
        latency = (
            sum(r["latency_s"]["mean"] * r["ok"] for r in timed) / max(1, sum(r["ok"] for r in timed))
            if timed
            else None
        )
        return {"tokens_per_s": sum(r["completion_tokens"] for r in same) / wall, "latency_s": latency}

    levels = sorted({r["concurrency"] for r in runs})
    lo, hi = levels[0], levels[-1]
    out = {
        "lost_or_failed": sum(
            r["failed"]
            + r["lost"]
            + (r.get("long_prompts") or {}).get("failed", 0)
            + (r.get("long_prompts") or {}).get("lost", 0)
            for r in runs
        )
    }
    # scaling compares two concurrencies: a run at one has none to report (not a 1.00x that fails the floor)
    if hi > lo and (a := pooled(lo, "off")) and (b := pooled(hi, "off")) and a["tokens_per_s"] > 0:
        out[f"throughput_scaling_c{hi}_over_c{lo}_no_speculation"] = b["tokens_per_s"] / a["tokens_per_s"]
    if (a := pooled(lo, "off")) and (b := pooled(lo, "on")) and a["latency_s"] and b["latency_s"]:
        out[f"latency_speedup_c{lo}_speculation"] = a["latency_s"] / b["latency_s"]
    for c in levels:
        if (a := pooled(c, "off")) and (b := pooled(c, "on")) and a["tokens_per_s"] > 0:
            out[f"speculation_on_over_off_c{c}"] = b["tokens_per_s"] / a["tokens_per_s"]
    for c in levels:
        for mode in MODES:
            mixed = _gaps(_runs(runs, c, mode, long_prompts=True))
            plain = _gaps(_runs(runs, c, mode, long_prompts=False))
            if mixed and plain and plain["p50"]:
                out[f"itl_p99_with_long_prompts_over_p50_without_c{c}_{mode}"] = mixed["p99"] / plain["p50"]
            share = pooled_pass_share(_runs(runs, c, mode, long_prompts=False))
            if share is not None:
                out[f"engine_pass_share_c{c}_{mode}"] = share
    return out


def _runs(runs: list[dict], concurrency: int, mode: str, long_prompts: bool) -> list[dict]:
    """The runs at one concurrency and speculation mode, with long prompts arriving or without them."""
    return [
        r
        for r in runs
        if r["concurrency"] == concurrency and r["speculation"] == mode and bool(r.get("long_prompts")) == long_prompts
    ]


def _gaps(runs: list[dict]) -> dict | None:
    """The inter-token latency distribution of the runs' requests, pooled (None: no gap)."""
    gaps = [g for r in runs for request in r.get("per_request", []) for g in request.get("chunk_gaps_s", [])]
    return _dist(gaps) if gaps else None


def _dist(xs: list[float]) -> dict:
    """mean, p50, p90, p99 (nearest rank) and max of the values; None each where there are none."""
    if not xs:
        return {"mean": None, "p50": None, "p90": None, "p99": None, "max": None}
    xs = sorted(xs)

    def rank(q: float) -> float:
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    return {"mean": statistics.fmean(xs), "p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": xs[-1]}
