"""`specdec bench-serve`: throughput, time to first token and latency of a server under concurrent load."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from ..benchmarks.bench_server import BenchServer
from .bench_serve_options import add_options, fill_defaults


def register(sub) -> None:
    p = sub.add_parser(
        "bench-serve",
        help="benchmark a specdec server at several concurrencies, with and without "
        "speculation (starts one unless --url is given)",
    )
    add_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import asyncio
    import os

    from ..benchmarks.prompts import load_prompts
    from ..benchmarks.runner import machine_info, stamp
    from ..errors import ConfigError
    from ..benchmarks.serve_report import markdown
    from ..benchmarks.load_summary import floors, summarize, summarize_long
    from ..benchmarks.loadgen import MODES, long_prompt_texts, run_level
    from ..benchmarks.serve_profile import between, scrape
    from ..prefill import parse_prefill_chunk

    mode = "fuzz" if args.fuzz else "soak" if args.soak else "load"
    if args.journal and mode != "fuzz":
        raise ConfigError("--journal keeps a --fuzz run's progress: give it with --fuzz N")
    fill_defaults(args, mode)
    if args.fuzz:
        return _fuzz(args)
    if args.soak:
        return _soak(args)
    levels = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    modes = [m.strip() for m in args.speculation.split(",") if m.strip()]
    if not levels or min(levels) < 1 or any(m not in MODES for m in modes) or args.max_tokens < 1 or args.rounds < 1:
        raise ConfigError(
            "--concurrency takes integers >= 1, --speculation off and/or on, --max-tokens and --rounds >= 1"
        )
    if any(t is not None and not t > 0 for t in (args.slo_ttft, args.slo_tpot)):
        raise ConfigError("--slo-ttft and --slo-tpot take seconds above 0")
    if args.long_prompts < 0 or args.long_prompt_tokens < 1:
        raise ConfigError("--long-prompts takes a count >= 0 and --long-prompt-tokens a count >= 1")
    parse_prefill_chunk(args.prefill_chunk)
    if args.profile:
        from .common import require_extra

        require_extra("prometheus_client", "serve", "--profile")
    prompts = [p.text for p in load_prompts(args.prompts, args.limit)]
    long_prompts = (
        long_prompt_texts([p.text for p in load_prompts(args.prompts)], args.long_prompts, args.long_prompt_tokens)
        if args.long_prompts
        else []
    )
    load_before = os.getloadavg()  # the machine is shared: say how busy it was
    server = BenchServer(args, args.max_batch or max(levels))
    url, model, health = server.url, server.model, server.health
    try:
        common = dict(
            max_tokens=args.max_tokens, temperature=args.temperature, api_key=args.api_key, timeout=args.timeout
        )
        for mode in modes:  # warm-up, not measured
            asyncio.run(run_level(url, model, prompts[:1], 1, MODES[mode], **{**common, "max_tokens": 8}))
        runs = []
        for c in levels:
            for round_ in range(1, args.rounds + 1):
                for mode in modes if round_ % 2 else modes[::-1]:  # off, on; then on, off; ...
                    for intruders in [[], long_prompts] if long_prompts else [[]]:
                        before = scrape(url, args.api_key) if args.profile else None
                        wall, results = asyncio.run(
                            run_level(url, model, prompts, c, MODES[mode], **common, long_prompts=intruders)
                        )
                        run_ = summarize(c, mode, wall, results[: len(prompts)], args.slo_ttft, args.slo_tpot)
                        if before is not None:
                            run_["profile"] = between(before, scrape(url, args.api_key))
                        if intruders:
                            run_["long_prompts"] = summarize_long(results[len(prompts) :])
                        runs.append({**run_, "round": round_})
                        _say(runs[-1])
    finally:
        server.stop()
    summary: dict[str, Any] = {
        "meta": {
            "url": server.where,
            "model": model,
            "drafter": health.get("drafter"),
            "max_batch": health.get("max_batch"),
            "prefix_cache": health.get("prefix_cache"),
            "prompt_file": str(args.prompts),
            "prompts": len(prompts),
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "concurrency": levels,
            "rounds": args.rounds,
            "long_prompts": args.long_prompts,
            "long_prompt_tokens": args.long_prompt_tokens if args.long_prompts else None,
            "prefill_chunk": args.prefill_chunk if not args.url else None,
            "server_exit_status": server.exit_status,
            "client_machine": machine_info(),
            **stamp(),
            "load_average_before": load_before,
            "load_average_after": os.getloadavg(),
        },
        "runs": runs,
        "floors": floors(runs),
    }
    report = markdown(summary)
    print(report)
    if args.out_json:
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
        print(f"wrote {args.out_json}", file=sys.stderr)
    if args.report:
        Path(args.report).parent.mkdir(parents=True, exist_ok=True)
        Path(args.report).write_text(report, encoding="utf-8")
        print(f"wrote {args.report}", file=sys.stderr)
    return 0 if summary["floors"]["lost_or_failed"] == 0 else 1


def _say(r: dict) -> None:
    print(
        f"concurrency {r['concurrency']:>3} round {r['round']} speculation {r['speculation']:>3}: "
        f"{r['tokens_per_s']:7.1f} tok/s, latency {r['latency_s']['mean'] or 0:.2f}s, TTFT "
        f"{r['ttft_s']['mean'] or 0:.2f}s, ITL p50 {r['itl_s']['p50'] or 0:.3f}s p99 {r['itl_s']['p99'] or 0:.3f}s"
        f"{', with %d long prompts' % r['long_prompts']['ok'] if r.get('long_prompts') else ''}, ok {r['ok']}, failed "
        f"{r['failed']}, lost {r['lost']}",
        file=sys.stderr,
        flush=True,
    )


def _fuzz(args) -> int:
    import time

    from ..benchmarks.fuzz import fuzz
    from ..benchmarks.fuzz_journal import FuzzJournal
    from ..benchmarks.runner import machine_info, stamp
    from ..errors import ConfigError
    from .common import require_extra

    require_extra("hypothesis", "dev", "--fuzz")
    require_extra("schemathesis", "dev", "--fuzz")
    if args.fuzz < 1:
        raise ConfigError("--fuzz takes a number of requests >= 1")
    journal = FuzzJournal(args.journal) if args.journal else None
    server = BenchServer(args, args.max_batch or 4)
    started = time.perf_counter()
    try:
        report = fuzz(
            server.url,
            server.model,
            args.fuzz,
            seed=args.seed,
            api_key=args.api_key,
            timeout=args.timeout,
            journal=journal,
        )
    finally:
        server.stop()
        if journal:
            journal.close()
    summary = {
        "meta": {
            "url": server.where,
            "model": server.model,
            "seed": args.seed,
            "seconds": round(time.perf_counter() - started, 1),
            "server_exit_status": server.exit_status,
            "client_machine": machine_info(),
            **stamp(),
        },
        **report.as_dict(),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "first_problems"}, indent=1))
    for issue in report.problems:
        print(f"problem: {issue}", file=sys.stderr)
    if args.out_json:
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
        print(f"wrote {args.out_json}", file=sys.stderr)
    return 0 if not report.problems and server.exit_status in (None, 0) else 1


def _soak(args) -> int:
    import asyncio
    import os

    from ..benchmarks.prompts import load_prompts
    from ..benchmarks.runner import machine_info, stamp
    from ..errors import ConfigError
    from ..benchmarks.soak import long_prompt_words, ordinary_prompts, soak
    from ..benchmarks.soak_report import plot, summarize

    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    if args.soak <= 0 or len(levels) != 1 or levels[0] < 1 or args.max_tokens < 1:
        raise ConfigError("--soak takes minutes > 0 and one --concurrency level >= 1")
    prompts = [p.text for p in load_prompts(args.prompts, args.limit)]
    server = BenchServer(args, args.max_batch or levels[0])
    context = server.health["max_context"]  # the server's real limit, --max-context or the model's
    try:
        long_words = asyncio.run(long_prompt_words(server.url, server.model, context, args.max_tokens, args.api_key))
        ordinary = ordinary_prompts(prompts, long_words)
        ramp_s = min(30.0, args.soak * 6)  # the client loops start over this many seconds
        results, memory = asyncio.run(
            soak(
                server.url,
                server.model,
                ordinary,
                args.soak,
                levels[0],
                args.max_tokens,
                long_words,
                args.api_key,
                args.timeout,
                args.seed,
                ramp_s=ramp_s,
            )
        )
    finally:
        server.stop()
    summary = summarize(results, memory, args.soak, warmup_s=min(60.0, args.soak * 60 / 4))
    summary["meta"] = {
        "url": server.where,
        "model": server.model,
        "drafter": server.health.get("drafter"),
        "concurrency": levels[0],
        "max_tokens": args.max_tokens,
        "long_prompt_words": long_words,
        "client_timeout_s": args.timeout,
        "max_context": context,
        "ramp_s": ramp_s,
        "max_batch": server.health.get("max_batch"),
        "capacity": server.health.get("capacity"),
        "prefix_cache": server.health.get("prefix_cache"),
        "prompts": len(ordinary),
        "prompts_left_out_as_long": len(prompts) - len(ordinary),
        "server_exit_status": server.exit_status,
        "client_machine": machine_info(),
        **stamp(),
        "load_average_after": os.getloadavg(),
    }
    totals = summary["totals"]
    print(
        f"soak {args.soak:g} min at concurrency {levels[0]}: {totals['requests']} requests, ok {totals['ok']}, "
        f"dropped on purpose {totals['dropped']}, failed {totals['failed']} (4xx {totals['http_4xx']}, "
        f"5xx {totals['http_5xx']}), lost {totals['lost']} (client timeout {args.timeout:g} s), 429s retried "
        f"{totals['http_429_retried']}; TTFT p50 {summary['ttft_s']['p50']} s, p99 {summary['ttft_s']['p99']} s; "
        f"memory growth after warm-up {summary['rss_growth_after_warmup']}",
        file=sys.stderr,
    )
    for error in summary["errors"]:
        print(f"  error: {error}", file=sys.stderr)
    if args.out_json:
        out = Path(args.out_json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2), encoding="utf-8")
        if plot(summary, out.with_suffix(".png")):
            print(f"wrote {out.with_suffix('.png')}", file=sys.stderr)
        print(f"wrote {args.out_json}", file=sys.stderr)
    return 0 if totals["lost"] == 0 and totals["http_5xx"] == 0 and server.exit_status in (None, 0) else 1
