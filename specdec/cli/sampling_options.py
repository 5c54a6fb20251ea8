"""The sampling options of `specdec generate` (temperature, top-k/p, min-p, penalties, logit bias, seed, stop
strings) and the GenerationConfig they make."""

from __future__ import annotations

import argparse

from ..config import GenerationConfig
from ..errors import ConfigError


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=256, help="default: 256")
    p.add_argument("--temperature", type=float, default=0.0, help="0 is greedy decoding (default: 0)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1] (default: 1, off)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default: 0, off)")
    p.add_argument(
        "--min-p",
        type=float,
        default=0.0,
        help="drop tokens less likely than this times the likeliest one (default: 0, off)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed for sampling")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--repetition-penalty",
        type=float,
        default=1.0,
        help="divide (multiply, if negative) the logits of tokens already in the text (default: 1, off)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float,
        default=0.0,
        help="subtract this times each token's count in the output so far, in [-2, 2] (default: 0)",
    )
    p.add_argument(
        "--presence-penalty",
        type=float,
        default=0.0,
        help="subtract this from tokens already in the output, in [-2, 2] (default: 0)",
    )
    p.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=BIAS",
        help="add BIAS (in [-100, 100]) to token ID's logit (repeatable)",
    )


def generation_config(args) -> GenerationConfig:
    """Validated before any model loads, so bad values fail fast."""
    return GenerationConfig.create(
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        stop=args.stop,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        frequency_penalty=args.frequency_penalty,
        presence_penalty=args.presence_penalty,
        logit_bias=parse_logit_bias(args.logit_bias),
    )


def parse_logit_bias(items: list[str]) -> dict[int, float]:
    """["ID=BIAS", ...] -> {ID: BIAS}."""
    out = {}
    for item in items:
        token, _, bias = item.partition("=")
        try:
            out[int(token)] = float(bias)
        except ValueError:
            raise ConfigError(f"--logit-bias takes TOKEN_ID=BIAS, got {item!r}") from None
    return out
