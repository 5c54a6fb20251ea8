"""`specdec train-drafter`: self-distil data from the target and train an EAGLE-style head on the CPU."""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..config import DTYPES

DEFAULT_PROMPTS = "../shared/data/train_prompts.jsonl"


def register(sub) -> None:
    p = sub.add_parser("train-drafter", help="train an EAGLE-style draft head for a target model (CPU)")
    p.add_argument("--model", default=None, help="target model (default: smollm2-135m)")
    p.add_argument("--out", required=True, help="folder for the head (safetensors + config naming its target)")
    p.add_argument("--prompts", default=DEFAULT_PROMPTS, help="training prompts, JSONL with a 'prompt' field")
    p.add_argument("--max-prompts", type=int, default=None, help="use this many prompts (round-robin over sources)")
    p.add_argument("--data-dir", default=None, help="where self-distilled data is cached (default: in the specdec cache)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="longest answer generated per prompt")
    p.add_argument("--batch-size", type=int, default=16, help="prompts answered together")
    p.add_argument("--time-budget", type=float, default=60.0, help="training minutes (data generation not counted)")
    p.add_argument("--draft-vocab", type=int, default=8192, help="tokens the head can propose (the most frequent)")
    p.add_argument("--steps", type=int, default=3, help="drafting steps unrolled in training")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dtype", default="auto", choices=DTYPES, help="target dtype for data generation")
    p.add_argument("--data-only", action="store_true", help="generate (or complete) the data, then stop")
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from ..drafters.eagle_head import CONFIG_FILE, load_head, new_head
    from ..errors import ConfigError
    from ..models.loading import load_model
    from ..models.registry import DEFAULT_MODEL, cache_root
    from ..training.eagle_trainer import Trainer, TrainSettings, choose_draft_vocab
    from ..training.selfdistill import generate_training_data, interleave_sources, read_shards

    if args.time_budget <= 0 or args.steps < 1 or args.draft_vocab < 16:
        raise ConfigError("--time-budget must be > 0, --steps >= 1 and --draft-vocab >= 16")
    name = args.model or DEFAULT_MODEL
    target = load_model(name, dtype=args.dtype)
    prompts = interleave_sources(args.prompts, args.max_prompts)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    data_dir = Path(args.data_dir) if args.data_dir else cache_root() / "train-data" / safe
    data = generate_training_data(target, prompts, data_dir, max_new_tokens=args.max_new_tokens,
                                  batch_size=args.batch_size)
    print(f"specdec: data in {data_dir}: {data['sequences']} sequences, {data['tokens']} tokens", file=sys.stderr)
    if args.data_only:
        return 0
    sequences = read_shards(data_dir)
    out = Path(args.out)
    torch.manual_seed(0)
    if (out / CONFIG_FILE).is_file():
        head = load_head(out, target).float().train()  # resume: keep its draft vocabulary
        coverage = None
    else:
        ids, coverage = choose_draft_vocab(sequences, args.draft_vocab, target.info.vocab_size)
        head = new_head(target.hf_model, name, ids)
        print(f"specdec: draft vocabulary of {len(ids)} tokens covers {coverage:.1%} of the target's choices",
              file=sys.stderr)
    settings = TrainSettings(steps=args.steps, lr=args.lr)
    trainer = Trainer(head, sequences, out, settings, time_budget_s=args.time_budget * 60)
    stats = trainer.run()
    record = {"command": "specdec " + " ".join(shlex.quote(a) for a in sys.argv[1:]), "target": name,
              "prompts": args.prompts, "prompts_used": len(prompts), "data_sequences": data["sequences"],
              "data_tokens": data["tokens"], "draft_vocab_coverage": coverage, "train_seconds": round(trainer.elapsed),
              "optimizer_steps": trainer.step, "heldout": stats}
    (out / "training_record.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record["heldout"]))
    return 0
