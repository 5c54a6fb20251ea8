"""Readable outputs of a benchmark JSON: a console table, a Markdown summary and a PNG chart."""

from __future__ import annotations

from pathlib import Path


def _fmt(x, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(result: dict) -> str:
    """Fixed-width table: one row per method."""
    ref = result.get("reference_dtype")
    head = (
        f"{'method':<30} {'tok/s':>8} {'speedup':>8} {'MAT':>6} {'MAL':>6} {'accept':>7} {'draft/pass':>10} "
        f"{'identical':>10} {'=plain':>6}"
    )
    if ref:
        head += f" {'=' + ref:>9}"
    lines = [
        f"model {result['model']} | dtype {result['dtype']} | {result['prompts']} prompts | "
        f"max_new_tokens {result['max_new_tokens']}",
        head,
        "-" * len(head),
    ]
    for name, m in result["methods"].items():
        same_none = m.get("identical_to_specdec_none")
        line = (
            f"{name:<30} {m['tokens_per_s']:>8.1f} {m['speedup']:>7.2f}x {_fmt(m['mean_accepted_tokens']):>6} "
            f"{_fmt(m.get('mean_acceptance_length')):>6} {_fmt(m.get('acceptance_rate'), '.0%'):>7} "
            f"{_fmt(m.get('drafted_token_over_target_pass'), '.3f'):>10} {m['identical']:>4}/{m['total']:<5} "
            f"{'-' if same_none is None else same_none:>6}"
        )
        if ref:
            line += f" {m['identical_to_reference']:>9}"
        if m.get("lossy"):  # its output may differ from the model's own: say so on its row
            differs = m.get("differs_from_plain")
            share = "" if differs is None else f": {differs['token_mismatch_share']:.1%} of tokens differ from plain"
            line += f"  LOSSY ({m['acceptance']}{share})"
        lines.append(line)
    return "\n".join(lines)


def markdown(result: dict) -> str:
    methods = result["methods"]
    categories = sorted(next(iter(methods.values()))["per_category"])
    out = [
        f"# specdec bench: {result['model']} ({result['dtype']})",
        "",
        f"{result['prompts']} prompts from `{result.get('prompt_file', '?')}`, greedy, max_new_tokens "
        f"{result['max_new_tokens']}, device {result.get('device', '?')}; speedup is over `hf_generate` "
        "measured in the same run; `identical` counts prompts whose tokens equal `hf_generate`'s. MAT: tokens per "
        "verify step, plain steps included; MAL: mean acceptance length, 1 + accepted drafts per drafting step "
        "(vLLM's figure, EAGLE's tau). = plain: identical to the same engine's plain decoding (specdec:none, or "
        "llamacpp for llamacpp_lookup). Methods named [RULE] use a LOSSY acceptance rule: their output may differ "
        "from the model's own (docs/acceptance.md).",
        "",
        "| method | tok/s | speedup | MAT | MAL | acceptance | identical | = plain |"
        + (f" = {result['reference_dtype']} reference |" if result.get("reference_dtype") else ""),
        "|---|---|---|---|---|---|---|---|" + ("---|" if result.get("reference_dtype") else ""),
    ]
    for name, m in methods.items():
        same_none = m.get("identical_to_specdec_none")
        same_none = "-" if same_none is None else f"{same_none}/{m['total']}"
        row = (
            f"| {name} | {m['tokens_per_s']:.1f} | {m['speedup']:.2f}x | {_fmt(m['mean_accepted_tokens'])} | "
            f"{_fmt(m.get('mean_acceptance_length'))} | {_fmt(m.get('acceptance_rate'), '.0%')} | {m['identical']}/{m['total']} | {same_none} |"
        )
        if result.get("reference_dtype"):
            row += f" {m['identical_to_reference']}/{m['total']} |"
        out.append(row)
    out += [
        "",
        "## Speedup by category (MAT in brackets)",
        "",
        "| category | " + " | ".join(methods) + " |",
        "|---" * (len(methods) + 1) + "|",
    ]
    for c in categories:
        cells = []
        for m in methods.values():
            pc = m["per_category"][c]
            mat = pc["mean_accepted_tokens"]
            cells.append(f"{pc['speedup']:.2f}x" + ("" if mat is None else f" ({mat:.2f})"))
        out.append(f"| {c} | " + " | ".join(cells) + " |")
    divergent = {n: m["divergences"] for n, m in methods.items() if m["divergences"]}
    if divergent:
        out += [
            "",
            "## Divergences from hf_generate",
            "",
            "First differing position and the baseline's top-2 logit gap there (a near-tie when small).",
            "",
            "| method | question | category | position | logit gap |",
            "|---|---|---|---|---|",
        ]
        for name, rows in divergent.items():
            for d in rows:
                out.append(
                    f"| {name} | {d['question_id']} | {d.get('category', '')} | {d['position']} | "
                    f"{_fmt(d['logit_gap'], '.4g')} |"
                )
    return "\n".join(out) + "\n"


def chart(result: dict, path: Path) -> None:
    """Grouped bars of speedup and MAT per category and method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = result["methods"]
    categories = sorted(next(iter(methods.values()))["per_category"])
    fig, axes = plt.subplots(2, 1, figsize=(max(8, len(categories) * 0.9), 8), sharex=True)
    width = 0.8 / len(methods)
    for i, (name, m) in enumerate(methods.items()):
        xs = [j + i * width for j in range(len(categories))]
        axes[0].bar(xs, [m["per_category"][c]["speedup"] for c in categories], width, label=name)
        mats = [m["per_category"][c]["mean_accepted_tokens"] for c in categories]
        if any(v is not None for v in mats):
            axes[1].bar(xs, [v or 0 for v in mats], width, label=name)
    axes[0].axhline(1.0, color="black", linewidth=0.8)
    axes[0].set_ylabel("speedup over hf_generate")
    axes[1].set_ylabel("mean accepted tokens / step")
    axes[1].set_xticks([j + 0.4 - width / 2 for j in range(len(categories))], categories, rotation=30, ha="right")
    axes[0].legend(fontsize=8, ncol=2)
    axes[0].set_title(f"{result['model']} ({result['dtype']}), {result['prompts']} prompts")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(result: dict, directory: str | Path) -> list[Path]:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    md, png = directory / "summary.md", directory / "speedup.png"
    md.write_text(markdown(result) + f"\n![speedup and MAT per category]({png.name})\n", encoding="utf-8")
    chart(result, png)
    return [md, png]
