"""Trains a variant of the shipped EAGLE head on train-drafter data folders and scores it on Spec-Bench's answers:
more decoder layers (`--extra-layers N`), or another weight on the token loss (`--w-token`).

An experiment, not a feature: the variant starts from the shipped head's weights (an extra layer starts as a copy of
its layer with the output projections zeroed, so the variant starts as the shipped head) and trains with
train-drafter's Trainer and settings (`--steps` optimizer steps, --lr 3e-4, as the docsynth run in
docs/drafters.md; `--repeat-source` as train-drafter's). Then it scores the held-out windows and every window of
`--score` (a folder no head trained on, such as the Spec-Bench 65 answers), by source.

    python experiments/head_variants.py --data $SPECDEC_CACHE/train-data/<mix folder>:1152 \
        --data $SPECDEC_CACHE/train-data/<mix folder>-synth512 --data $SPECDEC_CACHE/train-data/<mix folder>-doc512 \
        --exclude-source alpaca_eval-answer --repeat-source gsm8k-train:3 --extra-layers 1 --steps 787 \
        --draft-vocab-from $SPECDEC_CACHE/heads/smollm2-135m-docsynth --score DIR --out /tmp/variant \
        --out-json experiments/results/head_two_layers.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn as nn

from specdec.drafters import eagle_head as eh
from specdec.drafters.eagle_loading import load_head
from specdec.models.loading import load_model
from specdec.models.registry import DEFAULT_MODEL
from specdec.training.batching import TrainSettings
from specdec.training.datamix import parse_repeats, source_family, without_families
from specdec.training.shards import read_data
from specdec.training.trainer import Trainer, heldout_agreement, scorable, windows

SHIPPED = Path(__file__).resolve().parents[1] / "specdec/assets/heads/smollm2-135m"


class ExtraLayer(eh.HeadLayer):
    """One more decoder layer after the head's own, with its own input norm."""

    def __init__(self, config: eh.EagleConfig, inv_freq: torch.Tensor):
        super().__init__(config, attention_input=config.hidden_size)
        self.input_norm = eh.RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)


class DeeperHead(eh.EagleHead):
    """An EagleHead with `extra` more decoder layers. Keys and values of all layers are stacked on the head axis,
    (B, (1 + extra) * nkv, S, hd), so that the trainer's and drafter's concatenation along S keeps working."""

    def __init__(self, config, embed, lm_head, draft_ids, inv_freq, extra: int):
        super().__init__(config, embed, lm_head, draft_ids, inv_freq)
        self.extra = nn.ModuleList([ExtraLayer(config, inv_freq) for _ in range(extra)])

    def forward(self, features, tokens, positions, past=None, mask=None):
        nkv, layers = self.config.num_kv_heads, 1 + len(self.extra)
        x = self.fc(torch.cat([self.embed[tokens].to(features.dtype), features], dim=-1))
        pasts = [None] * layers if past is None else \
            [(past[0][:, i * nkv:(i + 1) * nkv], past[1][:, i * nkv:(i + 1) * nkv]) for i in range(layers)]
        x, (k, v) = self.layer(x, self.input_norm(x), positions, pasts[0], mask)
        keys, values = [k], [v]
        for layer, layer_past in zip(self.extra, pasts[1:]):
            x, (k, v) = layer.layer(x, layer.input_norm(x), positions, layer_past, mask)
            keys.append(k)
            values.append(v)
        return x, (torch.cat(keys, 1), torch.cat(values, 1))


def variant(target, extra: int, draft_ids: torch.Tensor) -> DeeperHead:
    """The shipped head's weights in a DeeperHead; each extra layer a copy of its layer whose outputs start at zero."""
    shipped = load_head(SHIPPED, target).float()
    head = DeeperHead(shipped.config, *eh.frozen_parts(target.hf_model, draft_ids), extra=extra)
    state = shipped.state_dict()
    head.load_state_dict(state, strict=False)
    layer_state = {k: v for k, v in state.items() if not k.startswith("fc.")}
    with torch.no_grad():
        for layer in head.extra:
            layer.load_state_dict(layer_state)
            layer.o_proj.weight.zero_()
            layer.down_proj.weight.zero_()
    return head


def by_source(head, wins: list[dict], settings: TrainSettings) -> dict:
    groups: dict[str, list[dict]] = {}
    for w in wins:
        groups.setdefault(source_family(w.get("source", "?")), []).append(w)
    return {k: heldout_agreement(head, v, settings) for k, v in sorted(groups.items())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", action="append", required=True, metavar="DIR[:N]",
                   help="a data folder (its first N records)")
    p.add_argument("--exclude-source", action="append", default=[], metavar="FAMILY")
    p.add_argument("--draft-vocab-from", required=True, help="a head whose draft vocabulary the variant uses")
    p.add_argument("--extra-layers", type=int, default=0)
    p.add_argument("--w-token", type=float, default=TrainSettings.w_token)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--repeat-source", action="append", default=[], metavar="FAMILY:N")
    p.add_argument("--score", required=True, help="a data folder no head trained on")
    p.add_argument("--out", required=True, help="the training folder (checkpoints; resumes)")
    p.add_argument("--out-json", default=None)
    p.add_argument("--model", default=DEFAULT_MODEL)
    args = p.parse_args()
    torch.manual_seed(0)
    target = load_model(args.model, dtype="float32")
    sequences = []
    for spec in args.data:
        folder, _, count = spec.partition(":")
        sequences += read_data([Path(folder)], target, max_items=int(count) if count else None)
    sequences = without_families(sequences, args.exclude_source)
    draft_ids = load_head(args.draft_vocab_from, target).draft_ids
    head = variant(target, args.extra_layers, draft_ids)
    head.save = lambda *a, **k: None  # a variant has no file format: its weights stay in the checkpoint
    settings = TrainSettings(steps=3, lr=3e-4, w_token=args.w_token)
    trainer = Trainer(head, sequences, Path(args.out), settings, time_budget_s=1e9, max_steps=args.steps,
                      repeats=parse_repeats(args.repeat_source))
    trainer.run(evaluate_every_s=600)
    # training rounds the frozen tables to bfloat16 where the CPU multiplies it; score with the exact ones, as
    # heldout_agreement.py scores the heads it loads
    embed, lm_head, _, _ = eh.frozen_parts(target.hf_model, draft_ids)
    head.float()
    head.embed, head.draft_lm_head = embed, lm_head[draft_ids]
    heldout = heldout_agreement(head, trainer.heldout, settings)
    scored = [w for s in scorable(read_data([Path(args.score)], target)) for w in windows(s, settings.max_len)]
    result = {"command": "python experiments/head_variants.py " + " ".join(sys.argv[1:]), "extra_layers": args.extra_layers,
              "w_token": args.w_token, "repeats": trainer.repeats, "steps": trainer.step,
              "answer_tokens_seen": trainer.tokens_seen, "train_seconds": round(trainer.elapsed),
              "heldout": heldout, "learning_curve": trainer.history, "score_data": args.score,
              "score": heldout_agreement(head, scored, settings), "score_by_source": by_source(head, scored, settings)}
    text = json.dumps(result, indent=1)
    print(text)
    if args.out_json:
        Path(args.out_json).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
