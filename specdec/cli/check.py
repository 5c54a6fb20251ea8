"""`specdec check-lossless`: greedy equality and a sampling homogeneity test of speculation against plain decoding,
on the user's own model, drafter, prompts and sampler settings (specdec/lossless.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import GenerationConfig, SamplingConfig
from ..errors import ConfigError
from .common import add_model_options, check_minimums, model_options
from .drafting_options import add_speculation_options, drafter_options

PROMPTS = (  # the sampling tests continue the first
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain speculative decoding in two sentences.",
    "A train travels 120 km in 1.5 hours. What is its average speed? Show your steps.",
    "Summarize: The meeting moved from Tuesday to Thursday because the projector broke, and the budget review "
    "now comes first.",
)
SETTINGS = ("temperature=1.0", "temperature=0.8,top_k=50,top_p=0.95,repetition_penalty=1.2,presence_penalty=0.3")
SETTING_KEYS = {
    "temperature": float,
    "top_k": int,
    "top_p": float,
    "min_p": float,
    "repetition_penalty": float,
    "frequency_penalty": float,
    "presence_penalty": float,
}


def register(sub) -> None:
    p = sub.add_parser(
        "check-lossless",
        help="check that speculation changes nothing on your model, drafter and "
        "prompts: greedy equality and a sampling homogeneity test",
    )
    p.add_argument(
        "--prompt", action="append", default=[], help="a prompt to check (repeatable; default: four built-in ones)"
    )
    p.add_argument("--prompts", default=None, help="Spec-Bench style JSONL of prompts (question_id, category, turns)")
    p.add_argument("--limit", type=int, default=None, help="prompts of --prompts, picked round-robin across categories")
    p.add_argument("--greedy-tokens", type=int, default=64, help="tokens per greedy comparison (default: 64; 0 skips)")
    p.add_argument(
        "--samples",
        type=int,
        default=500,
        help="continuations drawn per setting, with and again without speculation (default: 500; 0 skips)",
    )
    p.add_argument(
        "--sample-tokens",
        type=int,
        default=None,
        help="tokens per sampled continuation (default: k + 2, so that every draft position is verified)",
    )
    p.add_argument(
        "--batch",
        type=int,
        default=1,
        help="draw the speculative samples this many at a time, verified together in the batched engine "
        "(the server's path; default: 1, one at a time)",
    )
    p.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE,...",
        help=f"a sampler setting to test, of {', '.join(SETTING_KEYS)} (repeatable; default: "
        f"{' and '.join(repr(s) for s in SETTINGS)})",
    )
    p.add_argument(
        "--alpha",
        type=float,
        default=1e-3,
        help="chance that a lossless engine fails the sampling tests (Bonferroni over them; default: 1e-3)",
    )
    p.add_argument(
        "--tie-margin",
        type=float,
        default=1e-4,
        help="a greedy divergence where the target's two likeliest tokens are this close in log-probability "
        "is a near-tie, reported and not failed (default: 1e-4)",
    )
    p.add_argument("--out-json", default=None, help="write the report here")
    p.add_argument("--no-chat", action="store_true", help="send prompts as raw text, without the chat template")
    add_model_options(p, dtype="float32", dtype_note="float32, where greedy equality is exact")
    add_speculation_options(p, k=2, verifier="rejection")  # its samples all have seeds: auto would test coupled
    p.set_defaults(run=run)


def parse_setting(text: str) -> SamplingConfig:
    """'temperature=0.8,top_p=0.9' -> a validated SamplingConfig (temperature > 0: greedy is checked separately)."""
    values = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, sep, value = item.partition("=")
        if not sep or name not in SETTING_KEYS:
            raise ConfigError(
                f"--setting takes NAME=VALUE pairs with NAME one of {', '.join(SETTING_KEYS)}, got {item!r}"
            )
        try:
            values[name] = SETTING_KEYS[name](value)
        except ValueError:
            raise ConfigError(f"--setting: {name} must be a number, got {value!r}") from None
    if values.get("temperature", 1.0) <= 0:
        raise ConfigError(f"--setting {text!r}: temperature must be > 0 (greedy decoding is checked on its own)")
    values.setdefault("temperature", 1.0)
    return GenerationConfig.create(**values).sampling


def _checked_counts(args) -> None:
    if args.sample_tokens is None:
        args.sample_tokens = args.num_speculative_tokens + 2
    check_minimums(
        args, {"greedy_tokens": 0, "samples": 0, "sample_tokens": 1, "num_speculative_tokens": 1, "batch": 1}
    )
    if not 0 < args.alpha < 1:
        raise ConfigError(f"--alpha must be in (0, 1), got {args.alpha}")
    if args.tie_margin < 0:
        raise ConfigError(f"--tie-margin must be >= 0, got {args.tie_margin}")
    if args.out_json and not Path(args.out_json).resolve().parent.is_dir():
        raise ConfigError(f"--out-json {args.out_json}: its folder does not exist (checked before the run, not after)")
    if args.drafter == "none":
        raise ConfigError("--drafter none drafts nothing: there is no speculation to check")


def run(args) -> int:
    from tqdm.auto import tqdm

    from ..engine import SpecDecoder
    from ..lossless import LosslessReport, check_greedy, check_sampling, describe

    _checked_counts(args)
    settings = [parse_setting(s) for s in (args.setting or SETTINGS)]
    prompts = list(args.prompt)
    if args.prompts:
        from ..benchmarks.prompts import load_prompts

        prompts += [p.text for p in load_prompts(args.prompts, args.limit)]
    prompts = prompts or list(PROMPTS)
    decoder = SpecDecoder.load(
        args.model,
        drafter=args.drafter,
        num_speculative_tokens=args.num_speculative_tokens,
        adaptive=False,
        sampling_verifier=args.sampling_verifier,
        chat=not args.no_chat,
        **model_options(args),
        **drafter_options(args),
    )
    if decoder.drafter is None:
        raise ConfigError(f"drafter {args.drafter!r} gives no drafter for this model: there is no speculation to check")
    decoder.enable_prefix_cache(4)  # the sampling runs repeat one prompt: its prefill is reused
    encoded = [decoder.encode(p) for p in prompts]
    report = LosslessReport(alpha=args.alpha, tie_margin=args.tie_margin)
    name = decoder.drafter.name
    print(
        f"model {decoder.target.name} ({args.dtype}), drafter {name}, k={args.num_speculative_tokens} drafted at "
        f"every step, verifier {args.sampling_verifier}",
        file=sys.stderr,
    )
    if args.greedy_tokens:
        for i, ids in enumerate(tqdm(encoded, desc="greedy", unit="prompt", file=sys.stderr, disable=None)):
            report.greedy.append(check_greedy(decoder, ids, args.greedy_tokens, decoder.speculation, prompts[i][:60]))
    if args.samples:
        bar = tqdm(
            total=args.samples * len(settings), desc="sampling", unit="pair", file=sys.stderr, disable=None
        )  # no bar where stderr is no terminal
        for sampling in settings:
            bar.set_postfix_str(describe(sampling))
            report.sampling.append(
                check_sampling(
                    decoder,
                    encoded[0],
                    sampling,
                    args.samples,
                    args.sample_tokens,
                    decoder.speculation,
                    args.batch,
                    progress=bar.update,
                )
            )
        bar.close()
    print_report(report)
    if args.out_json:
        with open(args.out_json, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "model": decoder.target.name,
                    "dtype": args.dtype,
                    "drafter": name,
                    "num_speculative_tokens": args.num_speculative_tokens,
                    "sampling_verifier": args.sampling_verifier,
                    "prompts": prompts,
                    **report.to_dict(),
                },
                f,
                indent=1,
            )
    return 1 if report.failures() else 0


def print_report(report) -> None:
    from ..lossless import describe

    for i, g in enumerate(report.greedy, start=1):
        if g.identical:
            verdict = "identical"
        else:
            kind = "near-tie" if g.near_tie(report.tie_margin) else "DIFFERS"
            margin = "unknown" if g.margin is None else f"{g.margin:.3g}"
            verdict = f"{kind} at token {g.divergence} (top-2 logprob margin {margin})"
        print(f"greedy {i}: {g.tokens} tokens, {g.accepted}/{g.drafted} drafts accepted: {verdict}")
    for c in report.sampling:
        tests = ", ".join(
            f"{t.name} p={t.p_value:.3g}" + (f" (chi2 {t.statistic:.1f}, dof {t.dof})" if t.dof else " (no variation)")
            for t in c.tests
        )
        batched = f" (speculative ones {c.batch} at a time, batched)" if c.batch > 1 else ""
        print(
            f"sampling {describe(c.sampling)}: {c.samples} + {c.samples} continuations of {c.tokens} tokens{batched}, "
            f"{c.accepted}/{c.drafted} drafts accepted; {tests}"
        )
    for line in report.unexercised():
        print(f"warning: {line}", file=sys.stderr)
    failures = report.failures()
    for line in failures:
        print(f"FAILED {line}")
    count = sum(len(c.tests) for c in report.sampling)
    print(
        f"{'FAILED' if failures else 'passed'}: {len(report.greedy)} greedy comparisons, {count} sampling tests "
        f"(each at p < {report.threshold:.3g}: alpha {report.alpha:g}, Bonferroni)"
    )
