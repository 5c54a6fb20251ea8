"""llama.cpp's `llama-bench` on one GGUF file, for `specdec bench-shape --quant ... --llama-cpp DIR`.

It times decoding alone (`-p 0 -n N`: N one-token steps, llama-bench's tg test) after a context of `-d D` tokens
that it fills untimed, so with D = bench-shape's prompt tokens its steps see the same context lengths as specdec's
decoding steps after the prompt (specdec's `decode_tokens_per_s`). A second run times a whole request as specdec's
`tokens_per_s` does: `-pg D,N` from an empty context, the prompt's D tokens then N new ones (llama-bench's pg test),
whose new tokens over its seconds compare with specdec's. Both run with specdec's thread count, `-r` runs after
llama-bench's own warm-up run; its JSON also says its build.

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
    """The decoding test: N new tokens after D of context."""
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
        *_common(threads, repeats),
    ]


def request_command(binary: Path, gguf: Path, prompt_tokens: int, new_tokens: int, threads: int, repeats: int):
    """The request test: a prompt of P tokens then N new ones, from an empty context."""
    tests = ["-p", "0", "-n", "0", "-pg", f"{prompt_tokens},{new_tokens}", "-d", "0"]
    return [str(binary), "-m", str(gguf), *tests, *_common(threads, repeats)]


def _common(threads: int, repeats: int) -> list[str]:
    return ["-t", str(threads), "-r", str(repeats), "-o", "json"]


def parse(stdout: str, new_tokens: int) -> dict:
    """llama-bench's `-o json` output (a list of tests, each with avg_ts, stddev_ts, samples_ts and its settings)
    -> the tg test of `new_tokens` tokens: {"tokens_per_s" (its mean), "stddev_tokens_per_s",
    "samples_tokens_per_s", and KEPT's fields}."""
    test = _test(stdout, 0, new_tokens)
    return {
        "tokens_per_s": float(test["avg_ts"]),
        "stddev_tokens_per_s": float(test.get("stddev_ts", 0.0)),
        "samples_tokens_per_s": [float(x) for x in test.get("samples_ts", [])],
        **{key: test[key] for key in KEPT if key in test},
    }


def parse_request(stdout: str, prompt_tokens: int, new_tokens: int) -> dict:
    """llama-bench's `-o json` output -> its pg test of a `prompt_tokens` prompt and `new_tokens` new tokens:
    {"prompt_tokens", "new_tokens", "seconds" (the mean), "samples_seconds", "new_tokens_per_s"}. (llama-bench's own
    tokens/s of that test counts the prompt's tokens too.)"""
    test = _test(stdout, prompt_tokens, new_tokens)
    seconds = float(test["avg_ns"]) / 1e9
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "seconds": seconds,
        "samples_seconds": [float(x) / 1e9 for x in test.get("samples_ns", [])],
        "new_tokens_per_s": new_tokens / seconds,
    }


def _test(stdout: str, prompt_tokens: int, new_tokens: int) -> dict:
    """The test of llama-bench's JSON with these prompt and generated tokens, or a LlamaCppError."""
    try:
        tests = json.loads(stdout)
    except json.JSONDecodeError:
        raise LlamaCppError("llama-bench printed no JSON on its standard output (an unexpected version?)") from None
    found = [
        t for t in tests if isinstance(t, dict) and t.get("n_prompt") == prompt_tokens and t.get("n_gen") == new_tokens
    ]
    if not found:
        what = f"a prompt of {prompt_tokens} and " if prompt_tokens else ""
        raise LlamaCppError(f"llama-bench's JSON has no test of {what}{new_tokens} generated tokens")
    return found[0]


def run_llama_bench(folder: str | Path, gguf: Path, new_tokens: int, depth: int, threads: int, repeats: int) -> dict:
    """llama-bench's decoding figures on `gguf` (parse's dict, with the command it ran) and under "request" those of
    a request of a `depth`-token prompt (parse_request's, with its command), or a one-line error: SIGILL_LINE for a
    build this process may not run, else the tool's exit code and last line of stderr."""
    binary = find_tool(folder, TOOL)
    cmd = command(binary, gguf, new_tokens, depth, threads, repeats)
    decoding = parse(_run(cmd), new_tokens)
    request_cmd = request_command(binary, gguf, depth, new_tokens, threads, repeats)
    request = parse_request(_run(request_cmd), depth, new_tokens)
    return {**decoding, "command": cmd, "request": {**request, "command": request_cmd}}


def _run(cmd: list[str]) -> str:
    """The tool's standard output, or a one-line error."""
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if proc.returncode in SIGILL_CODES:
        raise ConfigError(SIGILL_LINE)
    if proc.returncode != 0:
        tail = [line for line in proc.stderr.splitlines() if line.strip()][-1:] or ["no message"]
        raise LlamaCppError(f"{TOOL} exited with {proc.returncode}: {tail[0].strip()}")
    return proc.stdout


def compare(result: dict, entry: dict) -> dict:
    """The bench-shape entry's llama.cpp fields: its figures, specdec's plain decoding over them (a whole request
    over llama-bench's pg test, and the steps after the prompt over its tg test: each like for like; specdec's
    request over the tg test too) and its share of the bandwidth bound."""
    theirs = result["tokens_per_s"]
    plain = entry["specdec_plain"]
    bound = entry.get("bandwidth_bound_tokens_per_s")
    return {
        "llama_bench": result,
        "specdec_request_over_llama_bench_request": plain["tokens_per_s"] / result["request"]["new_tokens_per_s"],
        "specdec_plain_over_llama_bench": plain["tokens_per_s"] / theirs,
        "specdec_decode_over_llama_bench": (
            plain["decode_tokens_per_s"] / theirs if plain.get("decode_tokens_per_s") else None
        ),
        "llama_bench_share_of_bound": theirs / bound if bound else None,
    }
