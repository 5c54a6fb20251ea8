"""`specdec bench-serve --profile`: where the server's time went during each run.

The server counts its engine thread's wall time by part (specdec/server/profile.py) and reads its threads' CPU
clocks at each scrape of /metrics. bench-serve scrapes before and after each run; the differences, over the time
between the two scrapes, give each part's share of the run, and the share of the engine's busy time (all but
idle) spent inside target passes (the step's pass and prefill passes): what a step costs beyond its pass.
"""

from __future__ import annotations

import time

PARTS = ("idle", "admission", "prefill", "draft", "pass", "verify", "text", "events")
THREADS = ("engine", "http")


def scrape(url: str, api_key: str | None = None) -> dict:
    """The server's counters of time now: {"at": client clock, "parts": {part: s}, "threads": {thread: CPU s},
    "process_cpu": s or None}."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    text = httpx.get(f"{url}/metrics", headers=headers, timeout=30).text
    at = time.perf_counter()
    parts, threads = dict.fromkeys(PARTS, 0.0), {}
    process_cpu = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "specdec_engine_seconds_total" and sample.labels.get("part") in PARTS:
                parts[sample.labels["part"]] = sample.value
            elif sample.name == "specdec_thread_cpu_seconds" and sample.labels.get("thread") in THREADS:
                threads[sample.labels["thread"]] = sample.value
            elif sample.name == "process_cpu_seconds_total":
                process_cpu = sample.value
    out = {"at": at, "parts": parts, "threads": threads, "process_cpu": process_cpu}
    return out


def between(before: dict, after: dict) -> dict:
    """A run's profile from the scrapes around it: seconds and share of the interval by part, the engine's busy
    seconds and the share of them inside target passes, and each thread's (and the process's) CPU seconds."""
    interval = max(after["at"] - before["at"], 1e-9)
    seconds = {p: max(0.0, after["parts"][p] - before["parts"][p]) for p in PARTS}
    busy = sum(v for p, v in seconds.items() if p != "idle")
    cpu = {
        t: after["threads"][t] - before["threads"][t]
        for t in THREADS
        if t in after["threads"] and t in before["threads"]
    }
    process = (
        after["process_cpu"] - before["process_cpu"]
        if after["process_cpu"] is not None and before["process_cpu"] is not None
        else None
    )
    return {
        "interval_s": interval,
        "seconds": seconds,
        "share": {p: v / interval for p, v in seconds.items()},
        "busy_s": busy,
        "pass_share_of_busy": (seconds["pass"] + seconds["prefill"]) / busy if busy else None,
        "thread_cpu_s": cpu,
        "process_cpu_s": process,
    }


def pooled_pass_share(runs: list[dict]) -> float | None:
    """The share of the runs' engine busy time inside target passes, their seconds added up."""
    profiles = [r["profile"] for r in runs if r.get("profile")]
    busy = sum(p["busy_s"] for p in profiles)
    inside = sum(p["seconds"]["pass"] + p["seconds"]["prefill"] for p in profiles)
    return inside / busy if busy else None


def markdown_rows(runs: list[dict]) -> list[str]:
    """The report's profile table: each part's share of the run, then the CPU the threads used a second."""
    profiled = [r for r in runs if r.get("profile")]
    if not profiled:
        return []
    lines = [
        "",
        "Where the engine thread's time went (share of each run's wall time), the share of its busy time "
        "inside target passes, and the CPU seconds a second of the engine thread, the HTTP layer's thread and "
        "the whole process:",
        "",
        "| concurrency | round | speculation | " + " | ".join(PARTS) + " | in passes | CPU engine / HTTP / process |",
        "|---:|---:|---|" + "---:|" * len(PARTS) + "---:|---|",
    ]
    for r in profiled:
        p = r["profile"]
        cpu = [p["thread_cpu_s"].get(t) for t in THREADS] + [p["process_cpu_s"]]
        cpu_text = " / ".join("n/a" if c is None else f"{c / p['interval_s']:.2f}" for c in cpu)
        mode = f"{r['speculation']}, long prompts" if r.get("long_prompts") else r["speculation"]
        share = p["pass_share_of_busy"]
        lines.append(
            f"| {r['concurrency']} | {r.get('round', 1)} | {mode} | "
            + " | ".join(f"{p['share'][part]:.1%}" for part in PARTS)
            + f" | {'n/a' if share is None else f'{share:.1%}'} | {cpu_text} |"
        )
    return lines
