"""`specdec replay TRACE`: what other drafters and draft lengths would have done on traced requests (no model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from ..errors import ConfigError

if TYPE_CHECKING:
    from ..drafters.base import Drafter
    from ..drafters.lookup.suffix import SuffixIndex

REPLAYABLE = ("ngram", "suffix")


def register(sub) -> None:
    p = sub.add_parser(
        "replay",
        help="replay an acceptance trace (written with --trace FILE) with other drafters "
        "and draft lengths, and predict their speed, without the model",
    )
    p.add_argument("trace", help="a JSONL trace from `specdec serve --trace FILE` or `specdec generate --trace FILE`")
    p.add_argument(
        "--drafters",
        default="ngram,suffix",
        help=f"drafters to replay, of {', '.join(REPLAYABLE)} (default: %(default)s)",
    )
    p.add_argument(
        "--k",
        default="1,2,3,4,6,8,adaptive",
        help="draft lengths: fixed ones (drafting every step) and/or 'adaptive' (specdec's policy, up to "
        "--k-max) (default: %(default)s)",
    )
    p.add_argument("--k-max", type=int, default=8, help="the adaptive policy's longest draft (default: 8)")
    p.add_argument("--ngram-min", type=int, default=2)
    p.add_argument("--ngram-max", type=int, default=4)
    p.add_argument(
        "--suffix-index",
        default=None,
        metavar="FILE",
        help="the suffix drafter starts from this index file (`specdec suffix-index build`, or a server's "
        "--suffix-index), as a server given it would; the file is only read",
    )
    p.add_argument("--out-json", default=None, help="write every figure here")
    p.add_argument(
        "--with-steps",
        action="store_true",
        help="in --out-json, also each request's [drafted, accepted] per step under each policy",
    )
    p.set_defaults(run=run)


def _policies(text: str, k_max: int) -> list[int | None]:
    out: list[int | None] = []
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if item == "adaptive":
            out.append(None)
        elif item.isdigit() and 1 <= int(item) <= 64:
            out.append(int(item))
        else:
            raise ConfigError(f"--k takes draft lengths from 1 to 64 and 'adaptive', got {item!r}")
    if not out or k_max < 1:
        raise ConfigError("--k needs at least one draft length, and --k-max must be >= 1")
    return out


def run(args) -> int:
    from ..costs import CostModel
    from ..drafters.lookup.ngram import NgramDrafter
    from ..drafters.lookup.suffix import SuffixDrafter
    from ..replay import replay_drafter, replay_logged, replay_plain, replayable
    from ..trace import read_trace_with_model

    drafters = [d.strip() for d in args.drafters.split(",") if d.strip()]
    unknown = [d for d in drafters if d not in REPLAYABLE]
    if unknown:
        raise ConfigError(f"cannot replay {', '.join(unknown)} without the model; replayable: {', '.join(REPLAYABLE)}")
    policies = _policies(args.k, args.k_max)
    ngram = NgramDrafter(args.ngram_min, args.ngram_max)  # checks the sizes before anything runs
    verify_costs, records, model = read_trace_with_model(args.trace)
    requests = replayable(records)
    if not requests:
        raise ConfigError(f"{args.trace}: no greedy, unconstrained request to replay ({len(records)} in all)")
    corpus = _corpus(args.suffix_index, requests, model) if args.suffix_index else []
    makers: dict[str, Callable[[], Drafter]] = {
        "ngram": lambda: ngram,
        "suffix": lambda: SuffixDrafter(shared=_index_of(corpus)),  # each policy from the file's state
    }
    costs = CostModel(verify_costs)
    plain = replay_plain(requests, costs)
    results = [replay_logged(requests, costs)]
    for name in drafters:
        for k in policies:
            label = f"{name} k={'adaptive' if k is None else k}"
            results.append(replay_drafter(requests, makers[name], label, verify_costs, k, args.k_max))
    logged = sorted({f"{r['drafter']} k<={r['k_max']}{' adaptive' if r['adaptive'] else ''}" for r in requests})
    print(
        f"{len(requests)} requests replayed of {len(records)} (sampled or constrained ones are left out); logged "
        f"with {', '.join(logged)}; {plain.tokens} tokens after the first of each"
        + (f"; suffix from {args.suffix_index} ({sum(map(len, corpus))} tokens)" if args.suffix_index else "")
    )
    print(f"{'policy':<22} {'MAT':>5} {'accept':>7} {'pred tok/s':>10} {'speedup':>8}  measured tok/s")
    for r in [plain, *results]:
        rate = "" if r.acceptance_rate is None else f"{r.acceptance_rate:.0%}"
        measured = f"{r.tokens / r.measured_seconds:14.1f}" if r.measured_seconds else ""
        print(
            f"{r.name:<22} {r.mean_accepted_tokens:5.2f} {rate:>7} {r.tokens_per_s:10.1f} "
            f"{plain.seconds / r.seconds if r.seconds else 0:7.2f}x {measured}"
        )
    best = max(results[1:] or results, key=lambda r: r.tokens_per_s)
    print(f"best: {best.name} (predicted {plain.seconds / best.seconds:.2f}x over plain decoding)")
    if args.out_json:
        out = {
            "trace": str(args.trace),
            "suffix_index": args.suffix_index,
            "requests": len(requests),
            "requests_in_trace": len(records),
            "verify_costs_s": verify_costs,
            "plain": plain.to_dict(),
            "policies": [
                {**r.to_dict(plain), **({"per_request_steps": r.per_request} if args.with_steps else {})}
                for r in results
            ],
            "best": best.name,
        }
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps(out, indent=1), encoding="utf-8")
        print(f"wrote {args.out_json}", file=sys.stderr)
    return 0


def _corpus(path: str, requests: list[dict], model: str) -> list[list[int]]:
    """The sequences of an index file, refused in one line where it cannot hold the trace's tokens: written for
    another model than the trace names, or for a vocabulary smaller than the trace's token ids."""
    from ..drafters.lookup.suffix import read_index_file

    if not Path(path).is_file():
        raise ConfigError(f"suffix index not found: {path}")
    meta, sequences = read_index_file(Path(path))
    if model and meta.get("model") and meta["model"] != model:
        raise ConfigError(f"suffix index {path} was written for model {meta['model']}, the trace for {model}")
    highest = max(max(r["prompt_ids"] + r["output_ids"]) for r in requests)
    if highest >= int(meta["vocab_size"]):
        raise ConfigError(
            f"suffix index {path} was written for a vocabulary of {meta['vocab_size']} tokens; the trace holds "
            f"token id {highest}"
        )
    return sequences


def _index_of(corpus: list[list[int]]) -> "SuffixIndex":
    """A fresh shared index holding `corpus` (within the index's size bound, newest kept, as a file load keeps)."""
    from ..drafters.lookup.suffix import SuffixIndex

    index = SuffixIndex()
    index.store_all(corpus)
    return index
