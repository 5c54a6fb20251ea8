"""The soak's summary (totals, per-kind and per-minute windows, the floors) and its PNG."""

from __future__ import annotations

from dataclasses import asdict

from .soak import KINDS, STATUSES, SoakResult


def summarize(results: list[SoakResult], memory: list[dict], minutes: float, warmup_s: float = 60.0) -> dict:
    """Totals, per-minute windows and the soak's floors (0 lost, 0 5xx, memory growth after warm-up < 10%: from the
    first sample at or after `warmup_s` to the last)."""
    windows = []
    for start in range(0, max(1, int(minutes * 60 + 0.999)), 60):
        rows = [r for r in results if start <= r.started_s < start + 60]
        rss = [m["rss_bytes"] for m in memory if start <= m["t_s"] < start + 60 and m["rss_bytes"]]
        windows.append(
            {
                "start_s": start,
                **_counts(rows),
                "ttft_s": _percentiles([r.ttft_s for r in rows if r.ttft_s is not None]),
                "latency_s": _percentiles([r.latency_s for r in rows if r.status == "ok"]),
                "rss_mb": round(max(rss) / 2**20, 1) if rss else None,
            }
        )
    after = [m["rss_bytes"] for m in memory if m["t_s"] >= warmup_s and m["rss_bytes"]]
    growth = (after[-1] - after[0]) / after[0] if len(after) >= 2 else None
    totals = _counts(results)
    return {
        "minutes": minutes,
        "totals": totals,
        "by_kind": {k: _counts([r for r in results if r.kind == k]) for k in KINDS},
        "ttft_s": _percentiles([r.ttft_s for r in results if r.ttft_s is not None]),
        "latency_s": _percentiles([r.latency_s for r in results if r.status == "ok"]),
        "rss_growth_after_warmup": growth,
        "windows": windows,
        "memory": memory,
        "errors": sorted({r.error for r in results if r.error and r.status != "ok"})[:10],
        "floors": {
            "lost": totals["lost"],
            "http_5xx": totals["http_5xx"],
            "rss_growth_under_10pct": growth is not None and growth < 0.10,
        },
        "requests": [asdict(r) for r in results],
    }


def _counts(rows: list[SoakResult]) -> dict:
    """Requests by status; final answers with a 4xx or 5xx status; 429s answered and retried (never final)."""
    out = {s: sum(r.status == s for r in rows) for s in STATUSES}
    out["http_5xx"] = sum((r.http_status or 0) >= 500 for r in rows)
    out["http_4xx"] = sum(400 <= (r.http_status or 0) < 500 for r in rows)
    out["http_429_retried"] = sum(r.retries for r in rows)
    return {"requests": len(rows), **out}


def _percentiles(xs: list[float]) -> dict:
    if not xs:
        return {"p50": None, "p99": None}
    xs = sorted(xs)
    return {"p50": round(xs[len(xs) // 2], 4), "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 4)}


def plot(summary: dict, path) -> bool:
    """Memory and p50/p99 latency per minute, as a PNG; False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    memory = [m for m in summary["memory"] if m["rss_bytes"]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot([m["t_s"] / 60 for m in memory], [m["rss_bytes"] / 2**20 for m in memory], color="k")
    left.set(xlabel="minutes", ylabel="server resident memory (MiB)", ylim=(0, None))
    windows = [w for w in summary["windows"] if w["latency_s"]["p50"] is not None]
    for key in ("p50", "p99"):
        right.plot([w["start_s"] / 60 for w in windows], [w["latency_s"][key] for w in windows], marker="o", label=key)
    right.set(xlabel="minute", ylabel="latency of complete requests (s)")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=90)
    plt.close(fig)
    return True
