"""`specdec serve`: an OpenAI-compatible HTTP server with batched speculative decoding."""

from __future__ import annotations

import os
import sys

from ..config import LOGPROBS_MODES
from ..parent_process import exit_with_parent
from ..prefill import parse_prefill_chunk
from .common import add_model_options, check_minimums, model_options
from .drafting_options import add_acceptance_option, add_speculation_options, drafter_options


def register(sub) -> None:
    p = sub.add_parser("serve", help="OpenAI-compatible server (/v1/completions, /v1/chat/completions, /metrics)")
    add_model_options(p)
    add_speculation_options(p)
    add_acceptance_option(p)
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="default: 8000")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SPECDEC_API_KEY"),
        help="require 'Authorization: Bearer KEY' (default: $SPECDEC_API_KEY; none: open)",
    )
    p.add_argument("--max-batch", type=int, default=16, help="sequences decoded together (default: 16)")
    p.add_argument(
        "--speculation-max-batch",
        type=int,
        default=None,
        metavar="N",
        help="steps with more than N running sequences draft nothing (no probes either) until the batch "
        "shrinks, as vLLM's disable_by_batch_size (default: no limit; the draft-length policy decides)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a batch slot; beyond that the server answers 429 (default: 64)",
    )
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        metavar="N",
        help="the most tokens one sequence holds (prompt, output and drafts), at most the model's context: "
        "each batch slot's KV cache holds N rows (reserved at start); a prompt that does not fit, or "
        "a max_tokens that does not fit with it, gets a 400 naming N (default: the model's context; "
        "in float32, smollm2-135m's 8192 take 377 MB a slot)",
    )
    p.add_argument(
        "--served-model-name", default=None, help="the name clients send as 'model' (default: --model, or smollm2-135m)"
    )
    p.add_argument(
        "--default-max-tokens",
        type=int,
        default=256,
        help="max_tokens of chat requests that give none, clipped to the context left (default: 256)",
    )
    p.add_argument(
        "--max-prefill-tokens",
        type=int,
        default=512,
        help="prompt tokens that may join the batch per step, at least one request (default: 512)",
    )
    p.add_argument(
        "--prefill-chunk",
        default="auto",
        metavar="N|auto|off",
        help="prompt tokens a step prefills while other requests run, so that a long prompt stalls the "
        "running streams for one chunk at a time; auto: a chunk about one and a half decoding steps long, "
        "more where more requests wait than run; off: whole prompts (CPU kernels only: output "
        "unchanged, token for token) (default: auto)",
    )
    p.add_argument(
        "--prefix-cache",
        type=int,
        default=16,
        metavar="N",
        help="finished requests whose KV caches stay in idle batch slots, so that a prompt beginning as an "
        "earlier one (a system prompt, a chat's earlier turns) skips that part of its prefill; "
        "0: off (default: 16)",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=("hermes",),
        default=None,
        help='read tool calls from the model\'s text when a request lets it choose (tool_choice "auto", '
        'the default with tools): hermes = <tool_call>{"name": ..., "arguments": ...}</tool_call>; '
        'without it such requests get a 400 ("required" and named calls need no parser)',
    )
    p.add_argument(
        "--logprobs-mode",
        choices=LOGPROBS_MODES,
        default="raw",
        help="what logprobs report: raw (the model's logits, the default, as vLLM's) or processed (the "
        "distribution each token is drawn from: penalties, constraint, temperature, filters)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE|DIR",
        default=None,
        help="append every request's acceptance trace (prompt and output token ids, drafted and accepted "
        "per step) to FILE, or to a new file in DIR, for `specdec replay` and `specdec train-drafter "
        "--data`; it holds the requests' text, so keep it private (docs/serving.md)",
    )
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="after SIGTERM, seconds the requests already admitted may take to finish (the server answers "
        "503 to new ones and /health says draining) before those left are ended with a 503 "
        "(default: 30)",
    )
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--access-log", action="store_true", help="log every HTTP request")
    p.set_defaults(run=run)


def served_drafter_options(args) -> dict:
    """The drafter options given (heads, tree shape, n-gram sizes...), for the default drafter and those requests
    pick by name; the draft model is loaded apart."""
    return {k: v for k, v in drafter_options(args).items() if k != "draft_model"}


def run(args) -> int:
    from ..errors import ConfigError

    minimums: dict[str, float] = {
        "max_batch": 1,
        "max_queue": 0,
        "default_max_tokens": 1,
        "max_prefill_tokens": 1,
        "port": 0,
        "prefix_cache": 0,
        "speculation_max_batch": 1,
        "max_context": 256,
    }
    check_minimums(args, minimums)
    exit_with_parent()  # where a bench or a test started this server, it ends with it
    if args.port > 65535:
        raise ConfigError(f"--port must be <= 65535, got {args.port}")
    prefill_chunk = parse_prefill_chunk(args.prefill_chunk)
    try:
        from ..server.app import create_app
        from ..server.launch import serve
        from ..server.loading import load_decoder
        from ..server.state import ServerSettings
    except ModuleNotFoundError as exc:
        raise ConfigError(f"specdec serve needs the 'serve' extra (pip install 'specdec[serve]'): {exc}") from None
    import torch

    from ..models.registry import DEFAULT_MODEL

    if args.threads:
        torch.set_num_threads(args.threads)
    model = args.model or DEFAULT_MODEL
    options = served_drafter_options(args)
    decoder = load_decoder(
        model,
        slots=args.max_batch,
        drafter=args.drafter,
        draft_model=args.draft_model,
        num_speculative_tokens=args.num_speculative_tokens,
        adaptive=not args.no_adaptive,
        sampling_verifier=args.sampling_verifier,
        max_batch_for_drafting=args.speculation_max_batch,
        acceptance=args.acceptance,
        max_context=args.max_context,
        **model_options(args),
        **options,
    )
    cached = decoder.enable_prefix_cache(args.prefix_cache)
    if args.trace:
        decoder.trace_to(args.trace)
    name = args.served_model_name or model
    settings = ServerSettings(
        model_name=name,
        aliases=tuple(sorted({model, decoder.target.name} - {name})),
        max_batch=args.max_batch,
        max_queue=args.max_queue,
        api_key=args.api_key or None,
        default_max_tokens=args.default_max_tokens,
        max_prefill_tokens=args.max_prefill_tokens,
        prefill_chunk=prefill_chunk,
        drafter_options=options,
        tool_parser=args.tool_call_parser,
        logprobs_mode=args.logprobs_mode,
    )
    drafter = decoder.drafter.name if decoder.drafter else "none"
    print(
        f"specdec serve: model {name} ({decoder.target.info.dtype}, {decoder.target.info.device}), drafter {drafter}, "
        + ("" if args.acceptance == "exact" else f"LOSSY acceptance {args.acceptance} (labelled in responses), ")
        + f"max batch {args.max_batch}, context {decoder.target.info.max_context} tokens, prefix cache "
        f"{args.prefix_cache if cached else 'off'}, "
        f"http://{args.host}:{args.port}{' (API key required)' if args.api_key else ''}",
        file=sys.stderr,
        flush=True,
    )
    serve(create_app(decoder, settings), args.host, args.port, args.shutdown_timeout, args.log_level, args.access_log)
    return 0
