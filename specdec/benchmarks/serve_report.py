"""The serving benchmark's Markdown report: one row per (concurrency, speculation) run, then the floors."""

from __future__ import annotations

from .serve_profile import markdown_rows

FLOORS = {  # name prefix -> (bound, whether the value must be at least or at most it, its format, what it means)
    "throughput_scaling": (
        5.0,  # issue 52: concurrency 16 at least 5x concurrency 1, without speculation
        "at least",
        "{:.2f}x",
        "aggregate tokens/s at the highest concurrency over the lowest, no speculation",
    ),
    "latency_speedup": (
        2.0,
        "at least",
        "{:.2f}x",
        "mean latency at the lowest concurrency without speculation over with it",
    ),
    "speculation_on_over_off": (
        1.0,
        "at least",
        "{:.2f}x",
        "aggregate tokens/s with speculation over without (never slower)",
    ),
    "engine_pass_share": (0.75, "at least", "{:.0%}", "share of the server engine's busy time inside target passes"),
    "itl_p99_with_long_prompts": (
        3.0,
        "at most",
        "{:.2f}x",
        "the streams' inter-token latency p99 while long prompts arrive, over its median without them",
    ),
}


def _f(x, digits=2, unit=""):
    return "n/a" if x is None else f"{x:.{digits}f}{unit}"


def markdown(summary: dict) -> str:
    meta = summary["meta"]
    lines = [
        f"# specdec serving benchmark: {meta['model']}",
        "",
        "MAT: tokens per verify step; MAL: 1 + accepted drafts per drafting step (vLLM's mean acceptance length).",
        "",
        f"{meta['prompts']} prompts from `{meta['prompt_file']}`, max_tokens {meta['max_tokens']}, temperature "
        f"{meta['temperature']}, server drafter `{meta.get('drafter', '?')}`, {meta.get('url', '')}; 1-minute "
        f"load average {_f((meta.get('load_average_before') or [None])[0])} before, "
        f"{_f((meta.get('load_average_after') or [None])[0])} after",
        "",
        "| concurrency | round | speculation | ok / failed / lost | prompt / completion tokens | tokens/s "
        "| TTFT p50 / p99 (s) | ITL p50 / p99 (s) | latency mean / p90 (s) | goodput (req/s) | acceptance | MAT "
        "| MAL |",
        "|---:|---:|---|---|---|---:|---|---|---|---:|---:|---:|---:|",
    ]
    for r in summary["runs"]:
        ttft, lat = r["ttft_s"], r["latency_s"]
        mixed = r.get("long_prompts")
        label = f"{r['speculation']}, {mixed['ok']} long prompts" if mixed else r["speculation"]
        itl, good = r.get("itl_s") or {}, (r.get("goodput") or {}).get("requests_per_s")
        lines.append(
            f"| {r['concurrency']} | {r.get('round', 1)} | {label} | {r['ok']} / {r['failed']} / {r['lost']} | "
            f"{r.get('prompt_tokens', '?')} / {r['completion_tokens']} | {r['tokens_per_s']:.1f} | "
            f"{_f(ttft.get('p50'))} / {_f(ttft.get('p99'))} | "
            f"{_f(itl.get('p50'), 3)} / {_f(itl.get('p99'), 3)} | "
            f"{_f(lat['mean'])} / {_f(lat['p90'])} | {_f(good)} | "
            f"{_f(r['acceptance_rate'])} | {_f(r['mean_accepted_tokens'])} | "
            f"{_f(r.get('mean_acceptance_length'))} |"
        )
    lines += markdown_rows(summary["runs"])
    lines += ["", "| floor | measured | required | met |", "|---|---:|---:|---|"]
    for name, value in summary["floors"].items():
        if name == "lost_or_failed":
            lines.append(f"| requests lost or failed (all runs) | {value} | 0 | {'yes' if value == 0 else 'NO'} |")
            continue
        bound, sense, form, what = next(v for k, v in FLOORS.items() if name.startswith(k))
        met = value >= bound if sense == "at least" else value <= bound
        lines.append(
            f"| {name} ({what}) | {form.format(value)} | {sense} {form.format(bound)} | {'yes' if met else 'NO'} |"
        )
    return "\n".join(lines) + "\n"
