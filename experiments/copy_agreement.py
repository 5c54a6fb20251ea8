"""Where an EAGLE head and prompt lookup agree with the target, one token ahead, on a train-drafter data folder.

At every answer position (teacher forced: the head reads the target's true features), this scores the head's top
choice, prompt lookup's (the token that followed the latest earlier occurrence of the context's last n tokens, n
from 4 down to 2, as `--drafter ngram` proposes it), either of them, and a rule that takes lookup's token wherever it
has one. It also splits the head's agreement by the target's own top-1 probability, and lookup's by match length.

    python experiments/copy_agreement.py --data DIR --whole --head specdec/assets/heads/smollm2-135m \
        --out-json experiments/results/copy_agreement.json

`--whole` scores every sequence (a folder no head trained on, such as Spec-Bench's answers, see
bench/heldout_agreement.py); without it, the held-out sequences only (as train-drafter holds them out).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from specdec.drafters.eagle_loading import load_head
from specdec.drafters.ngram import ngram_lookup
from specdec.models.loading import load_model
from specdec.models.registry import DEFAULT_MODEL
from specdec.training.batching import TrainSettings, is_heldout
from specdec.training.datamix import source_family, without_families
from specdec.training.shards import read_data
from specdec.training.trainer import scorable

CONFIDENCE_EDGES = (0.0, 0.3, 0.5, 0.7, 0.9, 1.01)


def lookup(context: np.ndarray) -> tuple[int | None, int]:
    """(prompt lookup's next token or None, the length of the suffix it matched: 4 down to 2, 0 for none)."""
    for n in (4, 3, 2):
        found = ngram_lookup(context, 1, n, n)
        if found.size:
            return int(found[0]), n
    return None, 0


@torch.no_grad()
def head_choices(head, sequence: dict) -> list[int]:
    """The head's top choice (token id) at each pair position p = 0..L-3: its guess of token p + 2."""
    tokens = torch.as_tensor(sequence["tokens"])
    n = len(tokens) - 2
    out, _ = head(sequence["features"][:n].float()[None], tokens[1:n + 1][None], torch.arange(n)[None])
    return head.draft_ids[head.draft_logits(out).argmax(-1)][0].tolist()


def score(head, sequences: list[dict]) -> dict:
    """Counts over the answer positions: the head, lookup, either, the rule; by confidence and by match length."""
    totals, by_source = Counts(), {}
    for s in sequences:
        tokens = np.asarray(torch.as_tensor(s["tokens"]), dtype=np.int64)
        labels, trainable = s["labels"].tolist(), s["trainable"].tolist()
        p1 = s["topk_logprobs"][:, 0].float().exp().tolist()
        mine = by_source.setdefault(source_family(s.get("source", "?")), Counts())
        for p, choice in enumerate(head_choices(head, s)):
            if not trainable[p + 1] or labels[p + 1] < 0:
                continue
            label = labels[p + 1]
            copied, n = lookup(tokens[:p + 2])
            for counts in (totals, mine):
                counts.add(choice == label, copied == label, n, p1[p + 1])
    return {**totals.summary(), "by_source": {k: v.summary(brief=True) for k, v in sorted(by_source.items())}}


class Counts:
    def __init__(self):
        self.n = self.head = self.lookup = self.either = self.rule = 0
        self.by_conf = [[0, 0] for _ in CONFIDENCE_EDGES[1:]]
        self.by_match = {m: [0, 0, 0] for m in (0, 2, 3, 4)}  # positions, lookup right, head right

    def add(self, head_right: bool, lookup_right: bool, match: int, confidence: float) -> None:
        self.n += 1
        self.head += head_right
        self.lookup += lookup_right
        self.either += head_right or lookup_right
        self.rule += lookup_right if match else head_right
        bucket = next(i for i, edge in enumerate(CONFIDENCE_EDGES[1:]) if confidence < edge)
        self.by_conf[bucket][0] += 1
        self.by_conf[bucket][1] += head_right
        row = self.by_match[match]
        row[0] += 1
        row[1] += lookup_right
        row[2] += head_right

    def summary(self, brief: bool = False) -> dict:
        n = max(1, self.n)
        out = {"positions": self.n, "head": round(self.head / n, 3), "lookup": round(self.lookup / n, 3),
               "either": round(self.either / n, 3), "lookup_else_head": round(self.rule / n, 3)}
        if brief:
            return out
        out["head_by_target_confidence"] = [
            {"p1_from": lo, "p1_to": min(hi, 1.0), "share": round(c / n, 3), "head": round(h / max(1, c), 3)}
            for (lo, hi), (c, h) in zip(zip(CONFIDENCE_EDGES, CONFIDENCE_EDGES[1:]), self.by_conf)]
        out["by_match_length"] = {
            str(m): {"share": round(c / n, 3), "lookup": round(lr / max(1, c), 3), "head": round(hr / max(1, c), 3)}
            for m, (c, lr, hr) in self.by_match.items()}
        return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", required=True, help="a train-drafter data folder")
    p.add_argument("--max-prompts", type=int, default=None, help="its first N records only")
    p.add_argument("--exclude-source", action="append", default=[], metavar="FAMILY")
    p.add_argument("--head", required=True, help="an EAGLE head's folder")
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--whole", action="store_true", help="score every sequence (a folder no head trained on)")
    p.add_argument("--out-json", default=None)
    args = p.parse_args()
    target = load_model(args.model, dtype="float32")
    sequences = scorable(without_families(read_data([Path(args.data)], target, max_items=args.max_prompts),
                                          args.exclude_source))
    if not args.whole:
        sequences = [s for s in sequences if is_heldout(s, TrainSettings().holdout)]
    head = load_head(args.head, target).float().eval()
    result = {"data": args.data, "head_folder": args.head, "whole": args.whole, "sequences": len(sequences),
              **score(head, sequences)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out_json:
        Path(args.out_json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
