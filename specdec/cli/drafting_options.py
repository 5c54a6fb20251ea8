"""The drafting options of the subcommands that decode (generate, serve, bench, check): which drafter, its settings,
the acceptance rule, and the drafter options they become. Values a drafter would refuse are refused while parsing,
before any model loads."""

from __future__ import annotations

import argparse

from ..config import ACCEPTANCE_FORMS, Acceptance
from ..errors import ConfigError
from .common import check_minimums


def add_speculation_options(p: argparse.ArgumentParser, k: int = 8, verifier: str = "auto") -> None:
    p.add_argument(
        "--drafter",
        default="auto",
        help="auto, none, ngram, suffix, lookahead, draft-model, eagle, eagle3, medusa, layerskip, quantized, select "
        "(default: auto = the best available: a given draft model, else a given EAGLE head or Medusa heads, "
        "else ngram); "
        "select: each step, whichever of --select-from is predicted to be fastest",
    )
    p.add_argument(
        "--draft-model", default=None, help="draft model for --drafter draft-model (same tokenizer as the target)"
    )
    p.add_argument(
        "-k", "--num-speculative-tokens", type=int, default=k, help=f"most tokens drafted per step (default: {k})"
    )
    p.add_argument(
        "--no-adaptive", action="store_true", help="always draft k tokens instead of adapting k to acceptance"
    )
    p.add_argument(
        "--sampling-verifier",
        default=verifier,
        choices=("auto", "rejection", "coupled"),
        help="lossless check when sampling: rejection (min(1, p/q)), coupled (seed-stable Gumbel coupling) "
        f"or auto (coupled for a request with a seed, else rejection) (default: {verifier})",
    )
    p.add_argument("--ngram-min", type=int, default=2, help="smallest n-gram the ngram drafter matches (default: 2)")
    p.add_argument("--ngram-max", type=int, default=4, help="largest n-gram the ngram drafter matches (default: 4)")
    p.add_argument(
        "--eagle-head",
        default=None,
        help="folder of a trained EAGLE head: specdec's, or an EAGLE-1/2/3 "
        "head in its authors' layout (default: the one shipped for the "
        "model, if any)",
    )
    p.add_argument(
        "--medusa-head",
        default=None,
        help="folder of Medusa heads: specdec's (train-drafter --kind medusa) or Medusa's own "
        "(medusa_lm_head.safetensors + config.json) (default: the ones shipped for the model, if any)",
    )
    p.add_argument("--chain", action="store_true", help="EAGLE and Medusa draft a chain instead of a tree")
    add_tree_options(p)
    add_lookahead_options(p)
    p.add_argument("--layerskip-layers", type=int, default=None, help="exit layer of the layerskip drafter")
    p.add_argument(
        "--draft-p-min",
        type=draft_p_min,
        default=0.0,
        metavar="P",
        help="draft-model, layerskip and quantized stop drafting after a token they give a probability below P, in "
        "[0, 1) (default: 0, off: the draft-length policy alone decides)",
    )
    p.add_argument(
        "--select-from",
        default=None,
        help="comma-separated candidates of --drafter select (default: eagle, medusa, ngram, suffix, those "
        "available for the model)",
    )
    p.add_argument(
        "--suffix-index",
        default=None,
        help="file (safetensors) the suffix drafter keeps past outputs in: "
        "read at start when it exists, written back as outputs arrive "
        "and at exit",
    )


def add_acceptance_option(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """--acceptance: exact (lossless, the default) or a LOSSY rule; with sweep, a comma-separated list of them."""
    what = "comma-separated acceptance rules, each run as its own method" if sweep else "which drafts are accepted"
    p.add_argument(
        "--acceptance",
        default="exact",
        type=acceptance_list if sweep else acceptance_spec,
        metavar="RULES" if sweep else "RULE",
        help=f"{what}: exact (default: lossless), or LOSSY top-k:K (the draft is among the target's K "
        "likeliest tokens), threshold:P (the target gives it probability >= P) or typical:EPS "
        "(Medusa's typical acceptance); lossy output may differ from the model's own and is "
        "labelled lossy everywhere (docs/acceptance.md)",
    )


def acceptance_spec(text: str) -> str:
    """One --acceptance rule, refused while parsing (before any model loads) unless it is one of ACCEPTANCE_FORMS."""
    try:
        return str(Acceptance.parse(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def acceptance_list(text: str) -> list[str]:
    """A comma-separated list of --acceptance rules, each checked; duplicates dropped, order kept."""
    rules = [acceptance_spec(t) for t in text.split(",") if t.strip()]
    if not rules:
        raise argparse.ArgumentTypeError(f"give at least one acceptance rule: {ACCEPTANCE_FORMS}")
    return list(dict.fromkeys(rules))


def add_tree_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tree-width",
        type=int,
        default=None,
        metavar="W",
        help="EAGLE and Medusa trees keep W candidates per level (default: chosen from the measured verify costs)",
    )
    p.add_argument(
        "--tree-nodes",
        type=int,
        default=None,
        metavar="N",
        help="EAGLE and Medusa trees hold the N most probable nodes, drafted to depth -k, whatever they "
        "cost (default: as many as pay under the measured verify costs, up to 48)",
    )
    p.add_argument(
        "--calibrate-trees",
        action="store_true",
        help="EAGLE trees are scored by the acceptance observed for the head's confidences, per draft "
        "depth and confidence bucket, instead of the raw confidences (docs/drafters.md)",
    )


def add_lookahead_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lookahead-window",
        type=int,
        default=None,
        metavar="W",
        help="lookahead drafter: parallel Jacobi iterations, one n-gram each per step (default: 4)",
    )
    p.add_argument(
        "--lookahead-ngram",
        type=int,
        default=None,
        metavar="N",
        help="lookahead drafter: n-gram size, the window's depth plus one (default: 3)",
    )
    p.add_argument(
        "--lookahead-guesses",
        type=int,
        default=None,
        metavar="G",
        help="lookahead drafter: most pooled n-grams verified per step (default: 6)",
    )


def lookahead_options(args) -> dict:
    """The lookahead drafter's W, N and G (None: its defaults), refused before any model loads where out of range."""
    from ..drafters.options import LookaheadOptions

    options = {
        "lookahead_window": args.lookahead_window,
        "lookahead_ngram": args.lookahead_ngram,
        "lookahead_guesses": args.lookahead_guesses,
    }
    LookaheadOptions(**options)
    return options


def draft_p_min(text: str) -> float:
    """--draft-p-min's value, refused while parsing (before any model loads) unless 0 <= P < 1."""
    from ..drafters.options import check_p_min

    try:
        return check_p_min(float(text))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def drafter_options(args) -> dict:
    check_minimums(args, {"tree_width": 1, "tree_nodes": 1})
    return {
        "draft_model": args.draft_model,
        "min_n": args.ngram_min,
        "max_n": args.ngram_max,
        "eagle_head": args.eagle_head,
        "medusa_head": args.medusa_head,
        "tree": not args.chain,
        "layerskip_layers": args.layerskip_layers,
        "suffix_index": args.suffix_index,
        "select_from": args.select_from,
        "draft_p_min": args.draft_p_min,
        "tree_width": args.tree_width,
        "tree_nodes": args.tree_nodes,
        "calibrate_trees": args.calibrate_trees,
        **lookahead_options(args),
    }
