"""`specdec bench-shape`: speed of named public model shapes with random weights (no download, no acceptance)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..config import BACKENDS, DTYPES
from .common import add_graphs_option


def register(sub) -> None:
    from ..benchmarks.shape_gguf import QUANTS
    from ..models.shapes import SHAPES

    p = sub.add_parser(
        "bench-shape",
        help="speed of public model shapes with random weights: specdec's plain "
        "decoding, transformers' generate, one pass per size (speed only); "
        "with --quant on a GGUF file of the shape, with --llama-cpp beside "
        "llama-bench",
    )
    p.add_argument("--shape", required=True, metavar="NAME[,NAME]", help=f"comma-separated shapes: {', '.join(SHAPES)}")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="weights dtype (default: auto)")
    p.add_argument(
        "--backend",
        default="auto",
        choices=BACKENDS,
        help="specdec's backend (default: auto, the one specdec picks; the JSON says which ran)",
    )
    add_graphs_option(p)
    p.add_argument("--prompt-tokens", type=int, default=125, help="random prompt tokens (default: 125)")
    p.add_argument("--new-tokens", type=int, default=128, help="tokens each decoding run makes (default: 128)")
    p.add_argument(
        "--pass-sizes",
        default="1,4,16,64",
        help="new tokens of the single passes timed after the prompt (default: 1,4,16,64)",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="timed runs of each decoding and each pass, after a warm-up; medians (default: 3)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights and prompt (default: 0)")
    p.add_argument(
        "--quant",
        default=None,
        choices=QUANTS,
        help="write the shape's weights as a GGUF file in this llama.cpp format (once, into specdec's "
        "cache: shapes/) and run it in that format on the CPU kernels; the JSON records the file, "
        "its bytes and the kernels' weight types. transformers' generate is not run (it cannot run "
        "quantized weights)",
    )
    p.add_argument(
        "--llama-cpp",
        default=None,
        metavar="DIR",
        help="with --quant: also run llama.cpp's llama-bench (in DIR) on that very file, right after "
        "specdec on the shape, with torch's thread count, --new-tokens tokens after a context of "
        "--prompt-tokens, --repeats runs; the JSON and table give its tokens/s and specdec's over "
        "it (docs/llamacpp.md)",
    )
    p.add_argument("--out-json", default=None, help="write the results JSON here")
    p.set_defaults(run=run)


def run(args) -> int:
    from ..benchmarks.shapes import ShapeBenchSettings, parse_sizes, run_shapes, table
    from ..errors import ConfigError

    names = [name.strip() for name in args.shape.split(",") if name.strip()]
    if not names:
        raise ConfigError("--shape needs at least one shape name")
    settings = ShapeBenchSettings(
        device=args.device,
        dtype=args.dtype,
        backend=args.backend,
        graphs=args.graphs,
        compile=args.compile,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        pass_sizes=parse_sizes(args.pass_sizes),
        repeats=args.repeats,
        seed=args.seed,
        quant=args.quant,
        llama_cpp=args.llama_cpp,
    )
    result = run_shapes(names, settings, progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(table(result))
    if args.out_json:
        Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out_json).write_text(json.dumps(result, indent=2), encoding="utf-8")
        print(f"wrote {args.out_json}", file=sys.stderr)
    return 0
