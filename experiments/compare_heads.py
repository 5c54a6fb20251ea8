"""Learning curves of several trained heads on one chart: held-out agreement at depth 1 and the chain MAT it
implies, against answer tokens seen, read from each head's config (its `training.history`).

    python experiments/compare_heads.py --head eagle=$SPECDEC_CACHE/heads/smollm2-135m-mix \
        --head eagle3=$SPECDEC_CACHE/heads/smollm2-135m-mix-eagle3 --out-png docs/eagle_vs_eagle3.png \
        --out-json experiments/results/eagle_vs_eagle3.json

The curves compare heads trained on the same data folder (the held-out sequences are chosen by a hash of their
tokens, so they are the same for every head trained on it); the JSON also gives each head's agreement at the
largest token count all heads reached (linear between the points measured), so that the comparison is at an
equal number of tokens seen.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

KEYS = ("acc1", "acc2", "acc3", "chain_mat")


def history(folder: Path) -> tuple[list[dict], dict]:
    """The head's held-out curve and its training settings, from a specdec EAGLE or EAGLE-3 config."""
    for name in ("eagle_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            config = json.loads(path.read_text())
            training = config.get("training") or config.get("specdec", {}).get("training") or {}
            return training.get("history", []), training.get("settings", {})
    raise SystemExit(f"compare_heads: {folder} holds no eagle_config.json or config.json")


def at_tokens(curve: list[dict], tokens: float) -> dict:
    """Each key linearly interpolated at `tokens` answer tokens seen."""
    for before, after in zip(curve, curve[1:]):
        if before["tokens_seen"] <= tokens <= after["tokens_seen"]:
            w = (tokens - before["tokens_seen"]) / max(1, after["tokens_seen"] - before["tokens_seen"])
            return {k: round(before[k] + w * (after[k] - before[k]), 3) for k in KEYS}
    point = curve[-1] if tokens >= curve[-1]["tokens_seen"] else curve[0]
    return {k: point[k] for k in KEYS}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--head", action="append", required=True, metavar="LABEL=DIR")
    p.add_argument("--out-png", required=True)
    p.add_argument("--out-json", required=True)
    args = p.parse_args()
    curves = {}
    for spec in args.head:
        label, _, folder = spec.partition("=")
        curve, settings = history(Path(folder))
        if not curve:
            raise SystemExit(f"compare_heads: {folder} has no held-out curve yet")
        curves[label] = {"folder": folder, "settings": settings, "history": curve}
    common = min(c["history"][-1]["tokens_seen"] for c in curves.values())
    result = {"common_tokens_seen": common, "at_common_tokens": {k: at_tokens(c["history"], common)
                                                                 for k, c in curves.items()}, "heads": curves}
    Path(args.out_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out_json).write_text(json.dumps(result, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for label, c in curves.items():
        seen = [h["tokens_seen"] / 1e6 for h in c["history"]]
        left.plot(seen, [h["acc1"] for h in c["history"]], marker="o", label=label)
        right.plot(seen, [h["chain_mat"] for h in c["history"]], marker="o", label=label)
    left.set(xlabel="answer tokens seen (millions)", ylabel="held-out agreement at depth 1", ylim=(0, 1))
    right.set(xlabel="answer tokens seen (millions)", ylabel="chain MAT implied (held out)")
    left.legend()
    fig.tight_layout()
    fig.savefig(args.out_png, dpi=90)
    print(json.dumps(result["at_common_tokens"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
