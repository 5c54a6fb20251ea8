"""Entry point of the `specdec` command: subcommands, and one-line errors instead of tracebacks."""

from __future__ import annotations

import os
import sys

from . import check, export_head, generate, models, replay, suffix_index
from .common import OneLineParser

SUBCOMMANDS = [generate, models, replay, suffix_index, check, export_head]


def _optional_subcommands():
    """Subcommands whose modules may need extras; each registers itself if importable."""
    import importlib

    for name in ("bench", "bench_shape", "train", "serve", "bench_serve"):
        try:
            yield importlib.import_module(f".{name}", __package__)
        except ModuleNotFoundError as exc:
            if not exc.name or not exc.name.startswith("specdec"):
                raise


def build_parser() -> OneLineParser:
    from .. import __version__

    parser = OneLineParser(prog="specdec", description="Lossless speculative decoding for Hugging Face causal LMs.")
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for module in [*SUBCOMMANDS, *_optional_subcommands()]:
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    args = build_parser().parse_args(argv)
    from ..errors import SpecdecError

    try:
        return args.run(args)
    except SpecdecError as exc:
        print(f"specdec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        print(f"specdec {args.command}: error: file not found: {exc.filename or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specdec {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as exc:  # a full disk, a folder not writable: what failed, in one line
        where = f": {exc.filename}" if exc.filename else ""
        print(f"specdec {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
