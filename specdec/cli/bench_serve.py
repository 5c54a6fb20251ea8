"""`specdec bench-serve`: throughput, time to first token and latency of a server under concurrent load."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..benchmarks.bench_server import BenchServer
from ..config import BACKENDS, DTYPES
from .common import add_graphs_option


def register(sub) -> None:
    p = sub.add_parser("bench-serve", help="benchmark a specdec server at several concurrencies, with and without "
                                           "speculation (starts one unless --url is given)")
    p.add_argument("--url", default=None, help="a running server (default: start `specdec serve` on a free port)")
    p.add_argument("--api-key", default=None, help="API key of the server at --url")
    p.add_argument("--prompts", default="../shared/data/specbench_dev.jsonl",
                   help="Spec-Bench JSONL (default: %(default)s)")
    p.add_argument("--limit", type=int, default=48,
                   help="prompts per run, round-robin across categories (default: 48, three waves at concurrency 16, "
                        "so that requests join and leave a running batch)")
    p.add_argument("--max-tokens", type=int, default=None,
                   help="max_tokens of every request (default: 128; --soak: 16, which a small CPU serves at 32 "
                        "at once)")
    p.add_argument("--temperature", type=float, default=0.0, help="default: 0 (greedy)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels (default: 1,4,16)")
    p.add_argument("--speculation", default="off,on", help="off (drafting off per request), on (the server's drafter)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of each speculation mode per concurrency, the order of the modes alternating round by "
                        "round (on a shared machine, pooled rounds compare on and off more fairly; default: 1)")
    p.add_argument("--model", default=None, help="model of the server started here (default: smollm2-135m)")
    p.add_argument("--drafter", default="auto", help="drafter of the server started here (default: auto)")
    p.add_argument("--draft-model", default=None)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    add_graphs_option(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the server started here")
    p.add_argument("--prefix-cache", type=int, default=16, metavar="N",
                   help="prefix cache entries of the server started here (0: off; default: 16, as `specdec serve`)")
    p.add_argument("--timeout", type=float, default=None,
                   help="the client's seconds per request: a request with no answer by then is failed (--soak: lost; "
                        "from its first attempt, 429 retries included) (default: 600; --fuzz: 30; --soak: 120)")
    p.add_argument("--max-context", type=int, default=None, metavar="N",
                   help="serve --max-context of the server started here (default: the model's; --soak: 1024)")
    p.add_argument("--max-batch", type=int, default=None, metavar="N",
                   help="serve --max-batch of the server started here (default: the highest --concurrency; --fuzz: 4)")
    p.add_argument("--max-queue", type=int, default=None, metavar="N",
                   help="serve --max-queue of the server started here (default: serve's, 64)")
    p.add_argument("--fuzz", type=int, default=0, metavar="N",
                   help="instead of the load test, send N requests hypothesis writes from the server's OpenAPI "
                        "document (valid, invalid and hostile) one at a time, and check every answer is a 2xx in OpenAI's shape or a 4xx OpenAI error "
                        "(exit 1 on any other); needs the 'dev' extra (schemathesis)")
    p.add_argument("--soak", type=float, default=0, metavar="MINUTES",
                   help="instead of the load test, a soak: --concurrency client loops (one level) send a mix of "
                        "requests (streamed or not, greedy or sampled, JSON schema, tools, stop strings, prompts "
                        "near the context limit, identical prompts together, streams dropped after a few chunks) "
                        "for MINUTES; records ok, failed, lost, 5xx, TTFT, latency and server memory per minute "
                        "(exit 1 on any lost request or 5xx)")
    p.add_argument("--seed", type=int, default=0, help="--fuzz and --soak: the seed of the requests drawn")
    p.add_argument("--journal", default=None, metavar="FILE",
                   help="--fuzz: append each request's outcome to this JSONL as it comes; the same command run again "
                        "counts the requests recorded there and sends only the rest (a stopped run resumes)")
    p.add_argument("--long-prompts", type=int, default=0, metavar="N",
                   help="a mixed workload: each run at each concurrency runs again with up to N long prompts sent "
                        "one after another while its streams run, and the floors compare the streams' inter-token "
                        "latency p99 then with its median without them (default: 0, no mixed runs)")
    p.add_argument("--long-prompt-tokens", type=int, default=2000, metavar="T",
                   help="about how many tokens each long prompt holds (default: 2000)")
    p.add_argument("--profile", action="store_true",
                   help="also report where the server's time went in each run (its engine thread's parts: idle, "
                        "admission, prefill, drafting, the target pass, verification, text, events; its threads' "
                        "CPU), read from its /metrics before and after the run, and the floor on the share of the "
                        "engine's busy time inside target passes")
    p.add_argument("--prefill-chunk", default="512", metavar="N|auto|off",
                   help="--prefill-chunk of the server started here (default: 512)")
    p.add_argument("--slo-ttft", type=float, default=None, metavar="SECONDS",
                   help="goodput: a request counts if its time to first token is at most this")
    p.add_argument("--slo-tpot", type=float, default=None, metavar="SECONDS",
                   help="goodput: a request counts if its time per output token after the first is at most this")
    p.add_argument("--out-json", default=None, help="write the results JSON here")
    p.add_argument("--report", default=None, help="write a Markdown table here (a .md file)")
    p.set_defaults(run=run)


MODE_DEFAULTS = {  # (max_tokens, timeout, max_context) where not given
    "load": (128, 600.0, None), "fuzz": (128, 30.0, None), "soak": (16, 120.0, 1024)}


def _fill_defaults(args, mode: str) -> None:
    max_tokens, timeout, max_context = MODE_DEFAULTS[mode]
    args.max_tokens = max_tokens if args.max_tokens is None else args.max_tokens
    args.timeout = timeout if args.timeout is None else args.timeout
    args.max_context = max_context if args.max_context is None else args.max_context


def run(args) -> int:
    import asyncio
    import os

    from ..benchmarks.prompts import load_prompts
    from ..benchmarks.runner import machine_info, stamp
    from ..errors import ConfigError
    from ..benchmarks.serve_report import markdown
    from ..benchmarks.loadgen import MODES, floors, long_prompt_texts, run_level, summarize, summarize_long
    from ..benchmarks.serve_profile import between, scrape
    from ..prefill import parse_prefill_chunk

    mode = "fuzz" if args.fuzz else "soak" if args.soak else "load"
    if args.journal and mode != "fuzz":
        raise ConfigError("--journal keeps a --fuzz run's progress: give it with --fuzz N")
    _fill_defaults(args, mode)
    if args.fuzz:
        return _fuzz(args)
    if args.soak:
        return _soak(args)
    levels = sorted({int(c) for c in args.concurrency.split(",") if c.strip()})
    modes = [m.strip() for m in args.speculation.split(",") if m.strip()]
    if not levels or min(levels) < 1 or any(m not in MODES for m in modes) or args.max_tokens < 1 or args.rounds < 1:
        raise ConfigError("--concurrency takes integers >= 1, --speculation off and/or on, --max-tokens and "
                          "--rounds >= 1")
    if any(t is not None and not t > 0 for t in (args.slo_ttft, args.slo_tpot)):
        raise ConfigError("--slo-ttft and --slo-tpot take seconds above 0")
    if args.long_prompts < 0 or args.long_prompt_tokens < 1:
        raise ConfigError("--long-prompts takes a count >= 0 and --long-prompt-tokens a count >= 1")
    parse_prefill_chunk(args.prefill_chunk)
    if args.profile:
        from .common import require_extra

        require_extra("prometheus_client", "serve", "--profile")
    prompts = [p.text for p in load_prompts(args.prompts, args.limit)]
    long_prompts = long_prompt_texts([p.text for p in load_prompts(args.prompts)], args.long_prompts,
                                     args.long_prompt_tokens) if args.long_prompts else []
    load_before = os.getloadavg()  # the machine is shared: say how busy it was
    server = BenchServer(args, args.max_batch or max(levels))
    url, model, health = server.url, server.model, server.health
    try:
        common = dict(max_tokens=args.max_tokens, temperature=args.temperature, api_key=args.api_key,
                      timeout=args.timeout)
        for mode in modes:  # warm-up, not measured
            asyncio.run(run_level(url, model, prompts[:1], 1, MODES[mode], **{**common, "max_tokens": 8}))
        runs = []
        for c in levels:
            for round_ in range(1, args.rounds + 1):
                for mode in modes if round_ % 2 else modes[::-1]:  # off, on; then on, off; ...
                    for intruders in ([[], long_prompts] if long_prompts else [[]]):
                        before = scrape(url, args.api_key) if args.profile else None
                        wall, results = asyncio.run(run_level(url, model, prompts, c, MODES[mode], **common,
                                                              long_prompts=intruders))
                        run_ = summarize(c, mode, wall, results[:len(prompts)], args.slo_ttft, args.slo_tpot)
                        if before is not None:
                            run_["profile"] = between(before, scrape(url, args.api_key))
                        if intruders:
                            run_["long_prompts"] = summarize_long(results[len(prompts):])
                        runs.append({**run_, "round": round_})
                        _say(runs[-1])
    finally:
        server.stop()
    summary = {"meta": {"url": server.where, "model": model, "drafter": health.get("drafter"),
                        "max_batch": health.get("max_batch"), "prefix_cache": health.get("prefix_cache"),
                        "prompt_file": str(args.prompts), "prompts": len(prompts),
                        "max_tokens": args.max_tokens, "temperature": args.temperature, "concurrency": levels,
                        "rounds": args.rounds, "long_prompts": args.long_prompts,
                        "long_prompt_tokens": args.long_prompt_tokens if args.long_prompts else None,
                        "prefill_chunk": args.prefill_chunk if not args.url else None,
                        "server_exit_status": server.exit_status, "client_machine": machine_info(), **stamp(),
                        "load_average_before": load_before, "load_average_after": os.getloadavg()},
               "runs": runs, "floors": floors(runs)}
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
    print(f"concurrency {r['concurrency']:>3} round {r['round']} speculation {r['speculation']:>3}: "
          f"{r['tokens_per_s']:7.1f} tok/s, latency {r['latency_s']['mean'] or 0:.2f}s, TTFT "
          f"{r['ttft_s']['mean'] or 0:.2f}s, ITL p50 {r['itl_s']['p50'] or 0:.3f}s p99 {r['itl_s']['p99'] or 0:.3f}s"
          f"{', with %d long prompts' % r['long_prompts']['ok'] if r.get('long_prompts') else ''}, ok {r['ok']}, failed "
          f"{r['failed']}, lost {r['lost']}",
          file=sys.stderr, flush=True)


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
        report = fuzz(server.url, server.model, args.fuzz, seed=args.seed, api_key=args.api_key, timeout=args.timeout,
                      journal=journal)
    finally:
        server.stop()
        if journal:
            journal.close()
    summary = {"meta": {"url": server.where, "model": server.model, "seed": args.seed,
                        "seconds": round(time.perf_counter() - started, 1), "server_exit_status": server.exit_status,
                        "client_machine": machine_info(), **stamp()}, **report.as_dict()}
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
        results, memory = asyncio.run(soak(server.url, server.model, ordinary, args.soak, levels[0], args.max_tokens,
                                           long_words, args.api_key, args.timeout, args.seed, ramp_s=ramp_s))
    finally:
        server.stop()
    summary = summarize(results, memory, args.soak, warmup_s=min(60.0, args.soak * 60 / 4))
    summary["meta"] = {"url": server.where, "model": server.model, "drafter": server.health.get("drafter"),
                       "concurrency": levels[0], "max_tokens": args.max_tokens, "long_prompt_words": long_words,
                       "client_timeout_s": args.timeout, "max_context": context, "ramp_s": ramp_s,
                       "max_batch": server.health.get("max_batch"), "capacity": server.health.get("capacity"),
                       "prefix_cache": server.health.get("prefix_cache"), "prompts": len(ordinary),
                       "prompts_left_out_as_long": len(prompts) - len(ordinary),
                       "server_exit_status": server.exit_status, "client_machine": machine_info(), **stamp(),
                       "load_average_after": os.getloadavg()}
    totals = summary["totals"]
    print(f"soak {args.soak:g} min at concurrency {levels[0]}: {totals['requests']} requests, ok {totals['ok']}, "
          f"dropped on purpose {totals['dropped']}, failed {totals['failed']} (4xx {totals['http_4xx']}, "
          f"5xx {totals['http_5xx']}), lost {totals['lost']} (client timeout {args.timeout:g} s), 429s retried "
          f"{totals['http_429_retried']}; TTFT p50 {summary['ttft_s']['p50']} s, p99 {summary['ttft_s']['p99']} s; "
          f"memory growth after warm-up {summary['rss_growth_after_warmup']}", file=sys.stderr)
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
