"""The CLI's parser, and the options shared by several subcommands (the model, graphs, minimums, optional extras),
and how they become configs. The drafting options are in drafting_options.py."""

from __future__ import annotations

import argparse

from ..config import BACKENDS, COMPILE, DTYPES, GRAPHS
from ..errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2, and which takes options only as
    spelled: argparse would read `--out` as `--out-json` (a prefix of one option), so a mistyped or guessed option
    would run with a meaning the user did not write."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # noqa: D401 - argparse API
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see --help)\n")


def one_line(text: str) -> str:
    """text with every character that breaks a line (newlines, but also the separators str.splitlines honours,
    such as \\x1e, which a user's argument may hold) written as its escape."""
    return "".join(ch if len(f"a{ch}a".splitlines()) == 1 else repr(ch)[1:-1] for ch in text)


def add_model_options(
    p: argparse.ArgumentParser, dtype: str = "auto", dtype_note: str = "auto = bfloat16 where native"
) -> None:
    p.add_argument(
        "--model", default=None, help="built-in alias, local folder, .gguf file or hub id (default: smollm2-135m)"
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument(
        "--dtype", default=dtype, choices=DTYPES, help=f"weights and activations dtype (default: {dtype_note})"
    )
    p.add_argument(
        "--backend",
        default="auto",
        choices=BACKENDS,
        help="kernels: specdec's CPU kernels (batch-invariant float32 compute, Llama family; bfloat16 "
        "products for prompts where the weights are bfloat16 and the CPU has AVX-512 BF16); "
        "kernels-fp32: float32 products for prompts too; kernels-bf16kv: the KV cache in bfloat16 "
        "(half its memory, faster at long contexts; auto's choice for a quantized GGUF file); kernels-bf16: bfloat16 products in every pass "
        "(faster, less exact, still batch-invariant); torch: "
        "specdec's Llama forward in torch (bit-identical to transformers); hf: transformers' forward "
        "(default: auto, the first of these that supports the model and device)",
    )
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="run a GGUF file's quantized weights as floats in --dtype, as transformers loads them (by "
        "default the CPU kernels keep Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K in the file's formats)",
    )
    add_graphs_option(p)
    p.add_argument(
        "--trust-remote-code", action="store_true", help="allow model code from the model's folder or hub repo"
    )


def model_options(args) -> dict:
    """The options add_model_options adds, but --model, as SpecDecoder.load takes them."""
    return {
        "device": args.device,
        "dtype": args.dtype,
        "backend": args.backend,
        "graphs": args.graphs,
        "compile": args.compile,
        "dequantize": args.dequantize,
        "trust_remote_code": args.trust_remote_code,
    }


def add_graphs_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--graphs",
        default="auto",
        choices=GRAPHS,
        help="the torch backend's decode and verify passes as CUDA graphs over buckets of shapes "
        "(docs/cuda.md): auto = on a CUDA GPU with the torch backend, off elsewhere; on = also on a "
        "CPU, where the same shape-static passes run uncaptured (needs --backend torch); off = eager "
        "passes (default: auto)",
    )
    p.add_argument(
        "--compile",
        default="auto",
        choices=COMPILE,
        help="those shape-static passes compiled by torch.compile before capture, fusing each layer's "
        "small operations into a few kernels (docs/cuda.md; each bucket compiled once, at its first "
        "use): on = wherever the shape-static passes run (needs --graphs on on a CPU); off = never; "
        "auto = off until measured on a GPU (default: auto)",
    )


def check_minimums(args, minimums: dict[str, float]) -> None:
    """Refuses an option below its minimum (options left unset, None, pass) in one line naming it."""
    for name, low in minimums.items():
        value = getattr(args, name)
        if value is not None and value < low:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= {low}, got {value}")


def require_extra(module: str, extra: str, what: str) -> None:
    """Refuses `what` before any work when an optional dependency is missing: one line naming the extra."""
    import importlib

    try:
        importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"{what} needs {module}, in the '{extra}' extra: pip install 'specdec[{extra}]'") from None
