"""What a LOSSY acceptance rule costs and gains, measured against exact decoding on the same prompts.

Figures (each over a set of prompts, one output per prompt from each side):
  token_mismatch_share: position by position, the share of positions where the two outputs differ, over the
      longer output's length (a position only one of them reaches counts as a difference);
  diverged_share: 1 - (tokens before the first difference) / (the longer output's length), summed over prompts:
      how much of the text comes after the two part ways (a lossy rule's first change shifts all that follows);
  identical: prompts whose outputs are token for token the same;
  off_greedy_share: the share of output tokens that are not the target's greedy choice after the same text (the
      output read back by the target in one pass): how often the rule itself departs, before the cascade that the
      two figures above also count (after one change, exact decoding's text no longer lines up);
  final_number_agreement: for maths questions (GSM8K), the share of questions whose answer's last number equals the
      last number of exact decoding's answer. It is agreement with the exact model, not accuracy: the questions
      come without reference answers here.
Speed figures (MAT, tokens/s and their ratio to exact decoding with the same drafter) come from the benchmark run.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from pathlib import Path

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def method_name(prefix: str, drafter: str, acceptance: str) -> str:
    """A benchmark method's name: "specdec:eagle" for exact acceptance, "specdec:eagle[top-k:4]" for a lossy rule."""
    return f"{prefix}:{drafter}" if acceptance == "exact" else f"{prefix}:{drafter}[{acceptance}]"


def differences(outputs: list[list[int]], exact: list[list[int]]) -> dict:
    """token_mismatch_share, diverged_share and identical (module docstring) of outputs against exact decoding's,
    prompt i against prompt i."""
    if len(outputs) != len(exact):
        raise ValueError(f"{len(outputs)} outputs against {len(exact)} exact ones")
    positions = mismatched = prefix = identical = 0
    for got, want in zip(outputs, exact):
        longest = max(len(got), len(want))
        common = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        positions += longest
        mismatched += longest - sum(a == b for a, b in zip(got, want))
        prefix += common
        identical += got == want
    return {
        "token_mismatch_share": mismatched / positions if positions else 0.0,
        "diverged_share": 1 - prefix / positions if positions else 0.0,
        "identical": identical,
        "prompts": len(outputs),
    }


def off_greedy_share(outputs: list[list[int]], greedy: list[list[int]]) -> float:
    """Share of the tokens in outputs that differ from greedy[i][j], the target's argmax before output token j."""
    tokens = sum(len(o) for o in outputs)
    return sum(a != b for o, g in zip(outputs, greedy) for a, b in zip(o, g, strict=True)) / tokens if tokens else 0.0


def final_number(text: str) -> str | None:
    """The last number in a text, written canonically ("1,200.50" -> "1200.5", "18.00" -> "18"); None if none."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        value = Decimal(found[-1].replace(",", ""))
    except InvalidOperation:
        return None
    return format(value.normalize(), "f") if value != value.to_integral() else str(int(value))


def final_number_agreement(answers: list[str], exact_answers: list[str]) -> dict:
    """How many answers end on the number exact decoding's answer to the same question ends on, over the
    questions where exact decoding's answer holds a number (share: None where none does)."""
    pairs = [(final_number(a), final_number(e)) for a, e in zip(answers, exact_answers)]
    judged = [(a, e) for a, e in pairs if e is not None]
    agree = sum(a == e for a, e in judged)
    return {"agree": agree, "questions": len(judged), "share": agree / len(judged) if judged else None}


def summarize_tradeoff(
    results: dict,
    rules: dict[str, tuple[str, str]],
    prompt_set: dict[str, str],
    texts: dict[str, dict[str, str]],
    greedy: dict[str, dict[str, list[int]]],
    plain: str = "specdec:none",
    maths: str = "gsm8k",
) -> dict:
    """Per method, the trade-off figures against exact decoding (the `plain` method: the target's own greedy output).

    results: the runner's {method: MethodResult}; rules: method -> (drafter, acceptance spec), "none" for plain;
    prompt_set: question id -> its set ("gsm8k", "specbench"); texts: method -> question id -> decoded output;
    greedy: method -> question id -> the target's argmax before each output token. Each method gets MAT,
    tokens/s, speed_over_exact (tokens/s over its drafter's exact method), speed_over_plain, differences from exact
    decoding (overall and per set), off_greedy_share and, on the `maths` set, final_number_agreement.
    """
    from functools import reduce

    from ..config import Acceptance
    from ..metrics import GenerationMetrics

    ids = list(results[plain].runs)
    sets = sorted(set(prompt_set.values()))

    def speed(name: str) -> float:
        runs = results[name].runs.values()
        return sum(len(r.tokens) for r in runs) / sum(r.seconds for r in runs)

    def outputs(name: str, qs: list[str]) -> list[list[int]]:
        return [results[name].runs[q].tokens for q in qs]

    exact_of = {drafter: name for name, (drafter, rule) in rules.items() if rule == "exact"}
    out = {}
    for name, (drafter, rule) in rules.items():
        acceptance = Acceptance.parse(rule)
        metrics = reduce(GenerationMetrics.merge, [r.metrics for r in results[name].runs.values()])
        maths_ids = [q for q in ids if prompt_set[q] == maths]
        out[name] = {
            "drafter": drafter,
            "acceptance": str(acceptance),
            "lossy": acceptance.lossy,
            "mode": acceptance.mode,
            "parameter": acceptance.value,
            "mean_accepted_tokens": metrics.mean_accepted_tokens,
            "acceptance_rate": metrics.acceptance_rate,
            "tokens_per_s": speed(name),
            "speed_over_exact": speed(name) / speed(exact_of[drafter]) if drafter in exact_of else None,
            "speed_over_plain": speed(name) / speed(plain),
            **differences(outputs(name, ids), outputs(plain, ids)),
            "off_greedy_share": off_greedy_share(outputs(name, ids), [greedy[name][q] for q in ids]),
            "by_set": {
                s: differences(
                    outputs(name, [q for q in ids if prompt_set[q] == s]),
                    outputs(plain, [q for q in ids if prompt_set[q] == s]),
                )
                for s in sets
            },
            "final_number_agreement": final_number_agreement(
                [texts[name][q] for q in maths_ids], [texts[plain][q] for q in maths_ids]
            )["share"],
        }
    return out


MODES = ("top-k", "threshold", "typical")
PANELS = (
    ("mean_accepted_tokens", "MAT (tokens per step)"),
    ("speed_over_exact", "tokens/s / exact's"),
    ("token_mismatch_share", "tokens differing from exact"),
    ("off_greedy_share", "tokens not the greedy choice"),
    ("final_number_agreement", "GSM8K final number = exact's"),
)


def tradeoff_chart(result: dict, path: str | Path) -> Path:
    """One column per lossy mode, one row per figure (PANELS), each against the mode's parameter; exact decoding
    with the same drafter is the dashed line. result: the trade-off JSON (bench/lossy_tradeoff.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = result["methods"]
    drafters = sorted({m["drafter"] for m in methods.values() if m["drafter"] != "none"})
    fig, axes = plt.subplots(len(PANELS), len(MODES), figsize=(4 * len(MODES), 2.6 * len(PANELS)), squeeze=False)
    for row, (key, label) in enumerate(PANELS):
        for col, mode in enumerate(MODES):
            ax = axes[row][col]
            for j, drafter in enumerate(drafters):
                color = f"C{j}"
                points = sorted(
                    (m["parameter"], m[key])
                    for m in methods.values()
                    if m["drafter"] == drafter and m["mode"] == mode and m[key] is not None
                )
                if points:
                    ax.plot(*zip(*points), "o-", color=color, label=drafter)
                exact = next((m[key] for m in methods.values() if m["drafter"] == drafter and not m["lossy"]), None)
                if exact is not None:
                    ax.axhline(exact, color=color, linestyle="--", linewidth=0.8)
            ax.set_xscale("log", base=2 if mode == "top-k" else 10)
            if key in ("token_mismatch_share", "final_number_agreement", "off_greedy_share"):
                ax.set_ylim(-0.03, 1.03)  # shares
            if row == 0:
                ax.set_title(f"{mode} (dashed: exact)")
            if row == len(PANELS) - 1:
                ax.set_xlabel({"top-k": "K", "threshold": "P", "typical": "EPS"}[mode])
            if col == 0:
                ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"LOSSY acceptance trade-off: {result['model']} ({result['dtype']}), {result['max_new_tokens']} tokens, "
        f"{sum(result['prompt_sets'].values())} prompts"
    )
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
