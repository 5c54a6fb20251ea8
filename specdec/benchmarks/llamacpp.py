"""Native llama.cpp as reference methods of `specdec bench`: `llamacpp` (llama-completion, plain greedy decoding)
and `llamacpp_lookup` (llama-lookup, its prompt-lookup speculative decoding), run as subprocesses per prompt.

What is measured, and how it differs from specdec's methods:
- The same prompt: the text the prompt's token ids decode to (chat template and special tokens included), which
  llama.cpp tokenizes with special tokens parsed and no BOS added (the GGUF says add_bos_token false); every run
  checks that llama.cpp's prompt token count equals len(prompt_ids) and fails otherwise.
- The same stopping as specdec's bench: greedy (--temp 0), at most max_new_tokens, ending at the target's first
  EOS token (kept, as specdec and transformers keep it). llama-lookup overshoots both: it stops once it has more
  than -n tokens and checks for an end-of-generation token only after a step, so a step's accepted drafts may run
  past either; those tokens are cut, their step's time stays (the step was needed for the last kept token).
  llama.cpp also ends at the other tokens its GGUF marks end-of-generation (smollm2: <|endoftext|>, <reponame>),
  which specdec decodes through.
- Time: llama.cpp's own figures, not process start-up or model load. llama-completion: prompt eval + eval +
  sampling time from its perf report (common_perf_print; what it leaves unaccounted is under 1%). llama-lookup:
  its own `encoded ... in X seconds` + `decoded ... in Y seconds`, clocks around the prompt's passes and the
  whole decoding loop (sampling and drafting included), because its perf report misplaces time: batches
  decoded without a synchronisation between them are booked together, and 10-30% stays unaccounted.
- Tokens: its output text re-tokenized with the target's tokenizer, so the equality columns are only
  indicative: llama.cpp runs the GGUF's quantized weights with its own arithmetic (specdec runs the same weights
  dequantized), and re-tokenizing text need not give back the ids it sampled.
- MAT of llama-lookup from its own counters (n_predict, n_drafted, n_accept): each round of sampling yields the
  accepted drafts plus one token, the first round comes from the prompt's pass, so verify steps = n_predict -
  n_accept - 1. It does not report drafting steps or per-position counts, so MAL and those stay empty.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, SpecdecError
from ..metrics import GenerationMetrics
from ..models.fetch import ensure_gguf
from ..models.registry import KNOWN_MODELS
from .runner import PromptRun

TOOLS = {"llamacpp": "llama-completion", "llamacpp_lookup": "llama-lookup"}  # method -> binary
PLAIN_OF = {"llamacpp_lookup": "llamacpp"}  # its own plain decoding, for the bench's equality column


class LlamaCppError(SpecdecError):
    """A llama.cpp tool failed or printed what it should not have."""


def find_tool(folder: str | Path, binary: str) -> Path:
    """The path of a built llama.cpp tool in `folder`, or a one-line error naming it."""
    path = Path(folder).expanduser() / binary
    if not path.is_file():
        raise ConfigError(f"--llama-cpp: {path} not found (build llama.cpp's {binary} target)")
    return path


@dataclass(frozen=True)
class Perf:
    """Timings of common_perf_print, in seconds, and the prompt size llama.cpp saw."""

    prompt_eval_s: float
    prompt_eval_tokens: int
    eval_s: float
    eval_runs: int
    sampling_s: float


@dataclass(frozen=True)
class LookupStats:
    """llama-lookup's own counters and drafting times."""

    encoded: int  # prompt tokens
    encode_s: float
    decode_s: float
    n_predict: int
    n_drafted: int
    n_accept: int
    draft_s: float  # t_draft_flat + t_draft


def _number(pattern: str, text: str, name: str) -> float:
    found = re.findall(pattern, text)
    if not found:
        raise LlamaCppError(f"llama.cpp printed no {name} (an unexpected version?)")
    return float(found[-1])


def parse_perf(stderr: str) -> Perf:
    """Reads common_perf_print's lines, e.g. `common_perf_print: prompt eval time =  52.07 ms /  53 tokens (...)`."""
    return Perf(
        prompt_eval_s=_number(r"prompt eval time =\s*([\d.]+) ms", stderr, "prompt eval time") / 1e3,
        prompt_eval_tokens=int(
            _number(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens", stderr, "prompt eval token count")
        ),
        eval_s=_number(r"\beval time =\s*([\d.]+) ms /\s*\d+ runs", stderr, "eval time") / 1e3,
        eval_runs=int(_number(r"\beval time =\s*[\d.]+ ms /\s*(\d+) runs", stderr, "eval run count")),
        sampling_s=_number(r"sampling time =\s*([\d.]+) ms", stderr, "sampling time") / 1e3,
    )


def parse_lookup(stderr: str) -> LookupStats:
    """Reads llama-lookup's summary (`encoded   47 tokens in    0.601 seconds, ...`, `n_predict    = 10`, ...)."""
    return LookupStats(
        encoded=int(_number(r"encoded\s+(\d+) tokens", stderr, "encoded token count")),
        encode_s=_number(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds", stderr, "encoding time"),
        decode_s=_number(r"decoded\s+\d+ tokens in\s+([\d.]+) seconds", stderr, "decoding time"),
        n_predict=int(_number(r"\bn_predict\s*=\s*(\d+)", stderr, "n_predict")),
        n_drafted=int(_number(r"\bn_drafted\s*=\s*(\d+)", stderr, "n_drafted")),
        n_accept=int(_number(r"\bn_accept\s*=\s*(\d+)", stderr, "n_accept")),
        draft_s=(
            _number(r"\bt_draft_flat\s*=\s*([\d.]+) ms", stderr, "t_draft_flat")
            + _number(r"\bt_draft\s*=\s*([\d.]+) ms", stderr, "t_draft")
        )
        / 1e3,
    )


END_OF_TEXT = " [end of text]\n"


def completion_text(stdout: str) -> str:
    """The generated text of `llama-completion --no-display-prompt -sp`: its pieces, then ` [end of text]` after an
    end-of-generation token, then a blank line."""
    text = stdout.removesuffix("\n\n")
    return text.removesuffix(END_OF_TEXT)


def lookup_text(stdout: str, prompt: str) -> str:
    """The generated text of llama-lookup, which prints a blank line, the prompt's pieces, the output, then two
    blank lines (one before its statistics, one after them, which go to stderr)."""
    head = "\n\n" + prompt
    if not stdout.startswith(head):
        raise LlamaCppError("llama-lookup did not echo the prompt as given (a BOS added, or a template applied?)")
    return stdout[len(head) :].removesuffix("\n\n\n\n")


def until_eos(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """tokens up to and including the first EOS."""
    for i, t in enumerate(tokens):
        if t in eos_ids:
            return tokens[: i + 1]
    return tokens


def lookup_metrics(stats: LookupStats, kept: int, prompt_tokens: int, seconds: float) -> GenerationMetrics:
    """GenerationMetrics from llama-lookup's counters (steps as the module docstring says; no MAL)."""
    steps = stats.n_predict - stats.n_accept - 1
    return GenerationMetrics(
        prompt_tokens=prompt_tokens,
        new_tokens=kept,
        steps=steps,
        step_tokens=stats.n_predict - 1,
        drafted_tokens=stats.n_drafted,
        accepted_tokens=stats.n_accept,
        draft_time_s=stats.draft_s,
        total_time_s=seconds,
    )


class LlamaCppMethod:
    """A llama.cpp tool as a bench method: `name`, `run(prompt_ids, max_new_tokens) -> PromptRun`."""

    def __init__(
        self, name: str, folder: str | Path, gguf: str | Path, tokenizer, eos_ids, threads: int, draft_max: int
    ):
        self.name, self.tokenizer, self.eos_ids = name, tokenizer, set(eos_ids)
        self.threads, self.draft_max = threads, draft_max
        self.binary, self.gguf, self.lookup = find_tool(folder, TOOLS[name]), Path(gguf), name == "llamacpp_lookup"

    def command(self, prompt: str, max_new_tokens: int) -> list[str]:
        common = [str(self.binary), "-m", str(self.gguf), "-t", str(self.threads), "--temp", "0", "-p", prompt]
        if self.lookup:  # it stops once it has more than -n tokens
            return common + ["-n", str(max(max_new_tokens - 1, 1)), "--spec-draft-n-max", str(self.draft_max)]
        return common + ["-n", str(max_new_tokens), "-no-cnv", "--no-display-prompt", "-sp", "--simple-io"]

    def run(self, prompt_ids: list[int], max_new_tokens: int) -> PromptRun:
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        proc = subprocess.run(self.command(prompt, max_new_tokens), capture_output=True, stdin=subprocess.DEVNULL)
        stdout = proc.stdout.decode("utf-8", errors="replace")
        stderr = proc.stderr.decode("utf-8", errors="replace")
        if proc.returncode != 0:
            tail = [line for line in stderr.splitlines() if line.strip()][-1:] or ["no message"]
            raise LlamaCppError(f"{self.binary.name} exited with {proc.returncode}: {tail[0].strip()}")
        if self.lookup:
            stats = parse_lookup(stderr)
            seconds, seen = stats.encode_s + stats.decode_s, stats.encoded
        else:
            stats, perf = None, parse_perf(stderr)
            seconds, seen = perf.prompt_eval_s + perf.eval_s + perf.sampling_s, perf.prompt_eval_tokens
        if seen != len(prompt_ids):
            raise LlamaCppError(f"{self.binary.name} saw {seen} prompt tokens, not {len(prompt_ids)}")
        text = lookup_text(stdout, prompt) if self.lookup else completion_text(stdout)
        tokens = until_eos(self.tokenizer(text, add_special_tokens=False)["input_ids"], self.eos_ids)[:max_new_tokens]
        if stats is None:
            return PromptRun(tokens=tokens, seconds=seconds)
        return PromptRun(
            tokens=tokens, seconds=seconds, metrics=lookup_metrics(stats, len(tokens), len(prompt_ids), seconds)
        )


def setup(folder: str | Path, model: str) -> Path:
    """Checks that the tools are built and returns the GGUF file they run: `model` itself where it is a .gguf file
    (the one specdec runs too), else the one `model` (a built-in alias) was converted from, fetched once."""
    for binary in TOOLS.values():
        find_tool(folder, binary)
    if model.lower().endswith(".gguf") and Path(model).expanduser().is_file():
        return Path(model).expanduser()
    if model not in KNOWN_MODELS:
        raise ConfigError(
            f"--llama-cpp needs a .gguf file or a built-in model, whose GGUF file it runs ({', '.join(KNOWN_MODELS)})"
        )
    return ensure_gguf(model)


def methods(folder: str | Path, gguf: Path, tokenizer, eos_ids, threads: int, draft_max: int) -> list[LlamaCppMethod]:
    return [LlamaCppMethod(name, folder, gguf, tokenizer, eos_ids, threads, draft_max) for name in TOOLS]


def describe(folder: str | Path, gguf: Path, threads: int, draft_max: int) -> dict:
    """The bench JSON's record of the tools (and the version they report), the GGUF file and the settings."""
    proc = subprocess.run(
        [str(find_tool(folder, TOOLS["llamacpp"])), "--version"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    version = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("version")]
    return {
        "dir": str(folder),
        "version": version[0] if version else None,
        "gguf": str(gguf),
        "threads": threads,
        "lookup_draft_max": draft_max,
        "tools": TOOLS,
        "time": "llama.cpp's own figures: llama-completion prompt eval + eval + sampling time, llama-lookup "
        "encoded + decoded seconds",
        "tokens": "output text re-tokenized with the target's tokenizer: equality only indicative",
    }
