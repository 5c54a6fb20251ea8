"""The options of `specdec bench-serve` (its load test, --fuzz and --soak) and each mode's defaults for those the
command line leaves unset."""

from __future__ import annotations

import argparse

from ..config import BACKENDS, DTYPES
from .common import add_graphs_option


def add_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="a running server (default: start `specdec serve` on a free port)")
    p.add_argument("--api-key", default=None, help="API key of the server at --url")
    p.add_argument(
        "--prompts", default="../shared/data/specbench_dev.jsonl", help="Spec-Bench JSONL (default: %(default)s)"
    )
    p.add_argument(
        "--limit",
        type=int,
        default=48,
        help="prompts per run, round-robin across categories (default: 48, three waves at concurrency 16, "
        "so that requests join and leave a running batch)",
    )
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="max_tokens of every request (default: 128; --soak: 16, which a small CPU serves at 32 at once)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="default: 0 (greedy)")
    p.add_argument("--concurrency", default="1,4,16", help="comma-separated levels (default: 1,4,16)")
    p.add_argument("--speculation", default="off,on", help="off (drafting off per request), on (the server's drafter)")
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of each speculation mode per concurrency, the order of the modes alternating round by "
        "round (on a shared machine, pooled rounds compare on and off more fairly; default: 1)",
    )
    p.add_argument("--model", default=None, help="model of the server started here (default: smollm2-135m)")
    p.add_argument("--drafter", default="auto", help="drafter of the server started here (default: auto)")
    p.add_argument("--draft-model", default=None)
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    p.add_argument("--dtype", default="auto", choices=DTYPES)
    p.add_argument("--backend", default="auto", choices=BACKENDS)
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="the server started here runs a GGUF file's (or the built-in model's) weights as floats in --dtype",
    )
    add_graphs_option(p)
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=None, help="torch threads of the server started here")
    p.add_argument(
        "--prefix-cache",
        type=int,
        default=16,
        metavar="N",
        help="prefix cache entries of the server started here (0: off; default: 16, as `specdec serve`)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="the client's seconds per request: a request with no answer by then is failed (--soak: lost; "
        "from its first attempt, 429 retries included) (default: 600; --fuzz: 30; --soak: 120)",
    )
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        metavar="N",
        help="serve --max-context of the server started here (default: the model's; --soak: 1024)",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        default=None,
        metavar="N",
        help="serve --max-batch of the server started here (default: the highest --concurrency; --fuzz: 4)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        metavar="N",
        help="serve --max-queue of the server started here (default: serve's, 64)",
    )
    p.add_argument(
        "--fuzz",
        type=int,
        default=0,
        metavar="N",
        help="instead of the load test, send N requests hypothesis writes from the server's OpenAPI "
        "document (valid, invalid and hostile) one at a time, and check every answer is a 2xx in OpenAI's shape or a 4xx OpenAI error "
        "(exit 1 on any other); needs the 'dev' extra (schemathesis)",
    )
    p.add_argument(
        "--soak",
        type=float,
        default=0,
        metavar="MINUTES",
        help="instead of the load test, a soak: --concurrency client loops (one level) send a mix of "
        "requests (streamed or not, greedy or sampled, JSON schema, tools, stop strings, prompts "
        "near the context limit, identical prompts together, streams dropped after a few chunks) "
        "for MINUTES; records ok, failed, lost, 5xx, TTFT, latency and server memory per minute "
        "(exit 1 on any lost request or 5xx)",
    )
    p.add_argument("--seed", type=int, default=0, help="--fuzz and --soak: the seed of the requests drawn")
    p.add_argument(
        "--journal",
        default=None,
        metavar="FILE",
        help="--fuzz: append each request's outcome to this JSONL as it comes; the same command run again "
        "counts the requests recorded there and sends only the rest (a stopped run resumes)",
    )
    p.add_argument(
        "--long-prompts",
        type=int,
        default=0,
        metavar="N",
        help="a mixed workload: each run at each concurrency runs again with up to N long prompts sent "
        "one after another while its streams run, and the floors compare the streams' inter-token "
        "latency p99 then with its median without them (default: 0, no mixed runs)",
    )
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=2000,
        metavar="T",
        help="about how many tokens each long prompt holds (default: 2000)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also report where the server's time went in each run (its engine thread's parts: idle, "
        "admission, prefill, drafting, the target pass, verification, text, events; its threads' "
        "CPU), read from its /metrics before and after the run, and the floor on the share of the "
        "engine's busy time inside target passes",
    )
    p.add_argument(
        "--prefill-chunk",
        default="auto",
        metavar="N|auto|off",
        help="--prefill-chunk of the server started here (default: auto)",
    )
    p.add_argument(
        "--slo-ttft",
        type=float,
        default=None,
        metavar="SECONDS",
        help="goodput: a request counts if its time to first token is at most this",
    )
    p.add_argument(
        "--slo-tpot",
        type=float,
        default=None,
        metavar="SECONDS",
        help="goodput: a request counts if its time per output token after the first is at most this",
    )
    p.add_argument("--out-json", default=None, help="write the results JSON here")
    p.add_argument("--report", default=None, help="write a Markdown table here (a .md file)")


MODE_DEFAULTS = {  # (max_tokens, timeout, max_context) where not given
    "load": (128, 600.0, None),
    "fuzz": (128, 30.0, None),
    "soak": (16, 120.0, 1024),
}


def fill_defaults(args, mode: str) -> None:
    """The options a mode (load, fuzz, soak) leaves unset, set to that mode's defaults."""
    max_tokens, timeout, max_context = MODE_DEFAULTS[mode]
    args.max_tokens = max_tokens if args.max_tokens is None else args.max_tokens
    args.timeout = timeout if args.timeout is None else args.timeout
    args.max_context = max_context if args.max_context is None else args.max_context
