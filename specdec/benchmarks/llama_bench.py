"""llama.cpp's `llama-bench` on one GGUF file, for `specdec bench-shape --quant ... --llama-cpp DIR`.

It times decoding alone (`-p 0 -n N`: N one-token steps, llama-bench's tg test) after a context of `-d D` tokens
that it fills untimed, so with D = bench-shape's prompt tokens its steps see the same context lengths as specdec's
decoding steps after the prompt (specdec's `decode_tokens_per_s`); specdec's `tokens_per_s` also counts the
prompt's pass. It runs with specdec's thread count, `-r` runs after its own warm-up run, and reports each run's
tokens/s; its JSON also says its build.

A llama.cpp built with GGML_NATIVE=ON on a CPU with AMX uses AMX's tile instructions, which Linux lets a process
run only once it has asked for the tile state; where that is not granted the tool dies of SIGILL, which is said
in one line with the build that avoids it.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

from ..errors import ConfigError
from .llamacpp import LlamaCppError, find_tool

TOOL = "llama-bench"
# killed by SIGILL (-4), or a wrapper shell's report of it (128 + 4)
SIGILL_CODES = (-signal.SIGILL, 128 + signal.SIGILL)
SIGILL_LINE = (
    "llama-bench died of SIGILL: llama.cpp was built for instructions this process may not use (on CPUs "
    "with AMX: build it with -DGGML_NATIVE=OFF and the AVX-512 options, AMX off; see docs/llamacpp.md)"
)
KEPT = (
    "build_commit",
    "build_number",
    "cpu_info",
    "backends",
    "model_type",
    "model_size",
    "model_n_params",
    "n_threads",
    "n_prompt",
    "n_gen",
    "n_depth",
    "type_k",
    "type_v",
    "flash_attn",
    "repack",
)  # of its JSON's fields


def command(binary: Path, gguf: Path, new_tokens: int, depth: int, threads: int, repeats: int) -> list[str]:
    return [
        str(binary),
        "-m",
        str(gguf),
        "-p",
        "0",
        "-n",
        str(new_tokens),
        "-d",
        str(depth),
        "-t",
        str(threads),
        "-r",
        str(repeats),
        "-o",
        "json",
    ]


def parse(stdout: str, new_tokens: int) -> dict:
    """llama-bench's `-o json` output (a list of tests, each with avg_ts, stddev_ts, samples_ts and its settings)
    -> the tg test of `new_tokens` tokens: {"tokens_per_s" (its mean), "stddev_tokens_per_s",
    "samples_tokens_per_s", and KEPT's fields}."""
    try:
        tests = json.loads(stdout)
    except json.JSONDecodeError:
        raise LlamaCppError("llama-bench printed no JSON on its standard output (an unexpected version?)") from None
    found = [t for t in tests if isinstance(t, dict) and t.get("n_prompt") == 0 and t.get("n_gen") == new_tokens]
    if not found:
        raise LlamaCppError(f"llama-bench's JSON has no test of {new_tokens} generated tokens")
    test = found[0]
    return {
        "tokens_per_s": float(test["avg_ts"]),
        "stddev_tokens_per_s": float(test.get("stddev_ts", 0.0)),
        "samples_tokens_per_s": [float(x) for x in test.get("samples_ts", [])],
        **{key: test[key] for key in KEPT if key in test},
    }


def run_llama_bench(folder: str | Path, gguf: Path, new_tokens: int, depth: int, threads: int, repeats: int) -> dict:
    """llama-bench's decoding figures on `gguf` (parse's dict, with the command it ran), or a one-line error:
    SIGILL_LINE for a build this process may not run, else the tool's exit code and last line of stderr."""
    cmd = command(find_tool(folder, TOOL), gguf, new_tokens, depth, threads, repeats)
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if proc.returncode in SIGILL_CODES:
        raise ConfigError(SIGILL_LINE)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no message"]
        raise LlamaCppError(f"{TOOL} exited with {proc.returncode}: {tail[0].strip()}")
    return {**parse(proc.stdout, new_tokens), "command": cmd}


def compare(result: dict, entry: dict) -> dict:
    """The bench-shape entry's llama.cpp fields: its figures, specdec's plain decoding over it (prompt pass
    included, and the steps after it alone: the like-for-like one) and its share of the bandwidth bound."""
    theirs = result["tokens_per_s"]
    plain = entry["specdec_plain"]
    bound = entry.get("bandwidth_bound_tokens_per_s")
    return {
        "llama_bench": result,
        "specdec_plain_over_llama_bench": plain["tokens_per_s"] / theirs,
        "specdec_decode_over_llama_bench": (
            plain["decode_tokens_per_s"] / theirs if plain.get("decode_tokens_per_s") else None
        ),
        "llama_bench_share_of_bound": theirs / bound if bound else None,
    }
