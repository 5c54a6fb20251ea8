"""`specdec train-drafter`: self-distil data from the target and train an EAGLE-style head (or Medusa heads) on
the CPU."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from ..files import write_text_atomic
from .train_head import feature_layers, head_to_train, stored_layers
from .train_options import add_options

MAX_SEQUENCE = 2048  # longest training sequence (prompt and answers): longer prompts are skipped


def register(sub) -> None:
    p = sub.add_parser(
        "train-drafter", help="train an EAGLE-style draft head (or Medusa heads) for a target model (CPU)"
    )
    add_options(p)
    p.set_defaults(run=run)


def run(args) -> int:
    import torch

    from ..errors import ConfigError
    from ..models.loading import load_model
    from ..models.registry import DEFAULT_MODEL, KNOWN_MODELS, cache_root
    from ..training.datamix import (
        default_mix,
        describe,
        mix_fingerprint,
        mix_order,
        parse_data_spec,
        parse_repeats,
        without_families,
    )
    from ..models.backend import check_feature_layers
    from ..training.extract import Extractor, data_meta, generate_training_data
    from ..training.selfdistill import cycle_sources, document_prompts, synthesize_prompts
    from ..training.shards import ShardWriter, read_data, shards_for
    from ..training.trainer import Trainer

    if args.time_budget <= 0 or args.steps < 1 or args.draft_vocab < 16:
        raise ConfigError("--time-budget must be > 0, --steps >= 1 and --draft-vocab >= 16")
    if args.authors_layout and args.kind != "eagle":
        raise ConfigError("--authors-layout is for --kind eagle (EAGLE-3 heads export as they are)")
    if args.medusa_num_heads < 1 or args.medusa_num_layers < 1:
        raise ConfigError("--medusa-num-heads and --medusa-num-layers must be >= 1")
    if (
        min(args.synthesize, args.document_tasks, args.temperature, args.follow_up_every) < 0
        or (args.max_prompts or 0) < 0
    ):
        raise ConfigError(
            "--synthesize, --document-tasks, --temperature, --follow-up-every and --max-prompts must be >= 0"
        )
    repeats = parse_repeats(args.repeat_source)
    files = [parse_data_spec(spec) for spec in args.data + ([args.prompts] if args.prompts else [])]
    files = files or default_mix()
    name = args.model or DEFAULT_MODEL
    # a built-in alias trains on its float conversion, as its shipped heads were (its file would run 4-bit)
    target = load_model(name, dtype=args.dtype, max_context=MAX_SEQUENCE, dequantize=name in KNOWN_MODELS)
    layers = feature_layers(args, target)  # what the head reads (EAGLE-3), or () for the final state
    stored = stored_layers(args, target, layers)
    check_feature_layers(stored, target.info.num_layers)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in name)
    setting = (
        f"-{mix_fingerprint(files, args.follow_up_every)}"
        + (f"-t{args.temperature:g}" if args.temperature > 0 else "")
        + (f"-layers{'_'.join(map(str, stored))}" if stored else "")
    )
    data_dir = Path(args.data_dir) if args.data_dir else cache_root() / "train-data" / (safe + setting)
    items = mix_order(files, args.follow_up_every, limit=args.max_prompts)
    traced = {item.source.split(":", 1)[1] for item in items if item.token_ids is not None}
    if traced - {name}:  # token ids only mean something to the tokenizer they came from
        raise ConfigError(f"--data holds traces of {', '.join(sorted(traced - {name}))}, not of {name}")
    if not items and not args.synthesize:
        raise ConfigError("no training prompts: --max-prompts 0 needs --synthesize N")
    meta = data_meta(
        target,
        args.max_new_tokens,
        args.temperature,
        {"mix": describe(files), "follow_up_every": args.follow_up_every},
        stored,
    )
    extractor = Extractor(
        target,
        args.max_new_tokens,
        args.batch_size,
        temperature=args.temperature,
        max_len=MAX_SEQUENCE,
        feature_layers=stored,
    )
    data = extractor.run(items, ShardWriter(data_dir, meta), block=max(64, 4 * args.batch_size))
    print(
        f"specdec: data in {data_dir}: {data['sequences']} sequences, {data['tokens']} tokens "
        f"({data['trained_tokens']} in answers)",
        file=sys.stderr,
    )
    folders = [data_dir, *map(Path, args.extra_data)]
    if args.synthesize:
        synth_dir = data_dir.with_name(f"{data_dir.name}-synth{args.synthesize}")
        synthetic = synthesize_prompts(target, cycle_sources(files[0].path, args.synthesize), synth_dir)
        generate_training_data(
            target,
            synthetic,
            synth_dir,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            temperature=args.temperature,
            feature_layers=stored,
        )
        folders.append(synth_dir)
    if args.data_only and not args.document_tasks:
        return 0
    # the first --max-prompts records, though the folder may hold more from an earlier, longer run (and none with
    # --max-prompts 0, where nothing was extracted: synthetic prompts only)
    sequences, records_used = [], 0
    if (data_dir / "index.json").is_file():
        sequences = read_data(folders[:1], target, layers, max_items=args.max_prompts)
        records_used = shards_for(json.loads((data_dir / "index.json").read_text()), args.max_prompts)[1]
    if records_used < data["done"]:
        print(
            f"specdec: training on the first {records_used} of its {data['done']} records: {len(sequences)} sequences",
            file=sys.stderr,
        )
    sequences += read_data(folders[1:], target, layers)  # document tasks are built from the answers in them
    if args.document_tasks:
        tasks = document_prompts(
            sequences, target.tokenizer, args.document_tasks, min_tokens=min(64, args.max_new_tokens // 2)
        )
        doc_dir = data_dir.with_name(f"{data_dir.name}-doc{args.document_tasks}")
        done = generate_training_data(
            target,
            tasks,
            doc_dir,
            max_new_tokens=args.max_new_tokens,
            batch_size=args.batch_size,
            temperature=args.temperature,
            extra_meta={"documents_from": [str(f) for f in folders]},
            feature_layers=stored,
        )
        print(
            f"specdec: document tasks in {doc_dir}: {done['sequences']} sequences, {done['tokens']} tokens",
            file=sys.stderr,
        )
        sequences += read_data([doc_dir], target, layers)
        folders.append(doc_dir)
    if args.data_only:
        return 0
    sequences = without_families(sequences, args.exclude_source)
    out = Path(args.out)
    torch.manual_seed(0)
    head, coverage, settings, objective = head_to_train(args, target, name, sequences, layers)
    trainer = Trainer(
        head, sequences, out, settings, time_budget_s=args.time_budget * 60, objective=objective, repeats=repeats
    )
    stats = trainer.run()
    record = {
        "command": "specdec " + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "kind": args.kind,
        "target": name,
        "mix": describe(files),
        "follow_up_every": args.follow_up_every,
        "records_used": records_used,
        "synthetic_prompts": args.synthesize,
        "document_tasks": args.document_tasks,
        "answer_temperature": args.temperature,
        "extra_data": args.extra_data,
        "init_from": args.init_from,
        "labels": args.labels,
        "excluded_sources": args.exclude_source,
        "repeated_sources": repeats,
        "data_sequences": len(sequences),
        "data_tokens": sum(len(s["tokens"]) for s in sequences),
        "answer_tokens": sum(int(s["trainable"].sum()) for s in sequences),
        "tokens_by_source": _tokens_by_source(sequences),
        "draft_vocab_coverage": coverage,
        "train_seconds": round(trainer.elapsed),
        "optimizer_steps": trainer.step,
        "answer_tokens_seen": trainer.tokens_seen,
        "heldout": stats,
        "learning_curve": trainer.history,
    }
    write_text_atomic(out / "training_record.json", json.dumps(record, indent=1))
    print(json.dumps(record["heldout"]))
    return 0


def _tokens_by_source(sequences: list[dict]) -> dict[str, dict[str, int]]:
    """Tokens, and answer tokens the head learns from, per source family (the source up to its first ':')."""
    from ..training.datamix import source_family

    out: dict[str, dict[str, int]] = {}
    for s in sequences:
        entry = out.setdefault(source_family(s["source"]), {"sequences": 0, "tokens": 0, "answer_tokens": 0})
        entry["sequences"] += 1
        entry["tokens"] += len(s["tokens"])
        entry["answer_tokens"] += int(s["trainable"].sum())
    return out
