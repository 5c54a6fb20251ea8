"""`specdec generate PROMPT`: stream one completion to stdout."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

from ..config import LOGPROBS_MODES, Constraint
from ..errors import ConfigError

from .common import add_model_options, model_options
from .drafting_options import add_acceptance_option, add_speculation_options, drafter_options
from .sampling_options import add_sampling_options, generation_config


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding (streams to stdout)")
    p.add_argument("prompt", help="the prompt; '-' reads it from standard input")
    add_model_options(p)
    add_speculation_options(p)
    add_acceptance_option(p)
    add_sampling_options(p)
    p.add_argument("--no-chat", action="store_true", help="send the prompt as raw text, without the chat template")
    p.add_argument("--stats", action="store_true", help="print speculation metrics to stderr")
    p.add_argument("--stats-json", action="store_true", help="print the metrics as one JSON line to stderr")
    p.add_argument(
        "--logprobs",
        type=int,
        default=None,
        metavar="N",
        help="print each generated token's logprob and its N most likely alternatives (0 to 20) to stderr, "
        "one JSON line per token",
    )
    p.add_argument(
        "--logprobs-mode",
        choices=LOGPROBS_MODES,
        default="raw",
        help="raw: of the model's logits (default); processed: of the distribution each token is drawn "
        "from (penalties, constraint, temperature, top-k/top-p/min-p)",
    )
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="append the request's acceptance trace (token ids, drafted and "
        "accepted per step) to FILE, for `specdec replay`",
    )
    shape = p.add_mutually_exclusive_group()
    shape.add_argument(
        "--json-schema",
        metavar="SCHEMA",
        help="constrain the output to a JSON schema: its JSON text, @FILE, or 'object' for any JSON "
        "object (structured output, lossless with every drafter)",
    )
    shape.add_argument("--regex", metavar="PATTERN", help="constrain the output to a regular expression")
    shape.add_argument(
        "--grammar", metavar="FILE", help="constrain the output to a Lark grammar (llguidance's dialect)"
    )
    p.set_defaults(run=run)


def constraint_option(args) -> Constraint | None:
    """--json-schema / --regex / --grammar as a checked Constraint (before any model loads)."""
    from ..structured import check

    schema = args.json_schema
    if schema is not None and (schema == "object" or schema.startswith("@")):
        schema = True if schema == "object" else _read(schema[1:])
    constraint = Constraint.of(schema, args.regex, None if args.grammar is None else _read(args.grammar))
    if constraint is not None:
        check(constraint)
    return constraint


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None


def run(args) -> int:
    from ..engine import SpecDecoder

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise ConfigError("the prompt is empty")
    config = replace(
        generation_config(args),
        logprobs=args.logprobs,
        constraint=constraint_option(args),
        logprobs_mode=args.logprobs_mode,
    )
    lossy = args.acceptance != "exact"
    if lossy and args.drafter == "none":
        raise ConfigError(
            f"--acceptance {args.acceptance} decides which drafts to accept, and --drafter none drafts "
            "nothing (plain decoding is exact): pick a drafter or leave --acceptance at exact"
        )
    if lossy:
        print(
            f"specdec generate: note: LOSSY acceptance {args.acceptance}: the output may differ from the model's own",
            file=sys.stderr,
        )
    decoder = SpecDecoder.load(
        args.model,
        drafter=args.drafter,
        num_speculative_tokens=args.num_speculative_tokens,
        adaptive=not args.no_adaptive,
        sampling_verifier=args.sampling_verifier,
        chat=not args.no_chat,
        acceptance=args.acceptance,
        **model_options(args),
        **drafter_options(args),
    )
    if args.trace:
        decoder.trace_to(args.trace)
    stream = decoder.stream(prompt, config)
    for delta in stream:
        sys.stdout.write(delta)
        sys.stdout.flush()
    sys.stdout.write("\n")
    metrics = stream.result.metrics
    text = decoder.target.tokenizer.decode
    for entry in stream.result.logprobs or ():
        print(
            json.dumps(
                {
                    "token": text([entry.token_id]),
                    "id": entry.token_id,
                    "logprob": round(entry.logprob, 6),
                    "top": [[text([i]), i, round(lp, 6)] for i, lp in entry.top],
                },
                ensure_ascii=False,
            ),
            file=sys.stderr,
        )
    if args.stats:
        name = decoder.drafter.name if decoder.drafter else "none"
        print(f"[specdec] model {decoder.target.name} | drafter {name} | {metrics.summary()}", file=sys.stderr)
    if args.stats_json:
        print(json.dumps(metrics.to_dict()), file=sys.stderr)
    return 0
