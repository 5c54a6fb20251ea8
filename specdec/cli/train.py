"""`specdec train-drafter`: self-distil data from the target and train an EAGLE-style head (or Medusa heads) on
the CPU."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..files import write_text_atomic
from .train_options import add_options

if TYPE_CHECKING:
    import torch

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
    from ..models.registry import DEFAULT_MODEL, cache_root
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
    target = load_model(name, dtype=args.dtype, max_context=MAX_SEQUENCE)
    layers = _feature_layers(args, target)  # what the head reads (EAGLE-3), or () for the final state
    stored = _stored_layers(args, target, layers)
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
    head, coverage, settings, objective = _head_to_train(args, target, name, sequences, layers)
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


def _stored_layers(args, target, layers: tuple[int, ...]) -> tuple[int, ...]:
    """The layers whose inputs the data keeps: an EAGLE head's data also keeps an EAGLE-3 head's default layers,
    so that one extraction trains either kind."""
    from ..drafters.heads.eagle3_head import default_feature_layers

    if layers or args.kind == "medusa":
        return layers
    return default_feature_layers(target.info.num_layers)


def _feature_layers(args, target) -> tuple[int, ...]:
    """The target layers an EAGLE-3 head reads (--feature-layers, or the default); () for other kinds."""
    from ..drafters.heads.eagle3_head import default_feature_layers
    from ..errors import ConfigError

    if args.kind != "eagle3":
        if args.feature_layers:
            raise ConfigError("--feature-layers is for --kind eagle3")
        return ()
    if not args.feature_layers:
        return default_feature_layers(target.info.num_layers)
    try:
        layers = tuple(int(x) for x in args.feature_layers.split(","))
    except ValueError:
        raise ConfigError(
            f"--feature-layers takes layer numbers separated by commas, got {args.feature_layers!r}"
        ) from None
    total = target.info.num_layers
    if not layers or len(set(layers)) != len(layers) or not all(0 <= i < total for i in layers):
        raise ConfigError(f"--feature-layers takes distinct layers from 0 to {total - 1}, got {args.feature_layers!r}")
    return layers


def _head_to_train(args, target, name: str, sequences: list[dict], layers: tuple[int, ...] = ()):
    """(head, draft vocabulary coverage or None when resuming, settings, objective) for --kind."""
    from ..drafters.heads import eagle3_head, eagle3_loading, eagle_head, eagle_loading, medusa_head
    from ..errors import ConfigError
    from ..training.batching import TrainSettings, choose_draft_vocab
    from ..training.medusa_trainer import medusa_losses

    out = Path(args.out)
    medusa, eagle3 = args.kind == "medusa", args.kind == "eagle3"
    settings = TrainSettings(steps=args.medusa_num_heads if medusa else args.steps, lr=args.lr, labels=args.labels)
    objective = medusa_losses if medusa else None
    load, config_file = (
        (medusa_head.load_medusa_heads, medusa_head.CONFIG_FILE)
        if medusa
        else (eagle3_loading.load_eagle3_head, eagle3_head.CONFIG_FILE)
        if eagle3
        else (eagle_loading.load_head, eagle_head.CONFIG_FILE)
    )
    if (out / config_file).is_file():  # resume: keep its draft vocabulary
        resumed: Any = load(out, target).float().train()
        if args.authors_layout and (resumed.config.input_norm or resumed.config.fc_bias):
            raise ConfigError(f"{out} holds a head in specdec's own layout; --authors-layout needs another --out")
        return resumed, None, settings, objective
    # a trained head's weights: an EagleHead, Eagle3Head or MedusaHeads, as --kind says
    start: Any = load(args.init_from, target).float() if args.init_from else None
    ids, coverage = choose_draft_vocab(
        sequences, args.draft_vocab, target.info.vocab_size, prior=getattr(start, "draft_ids", None)
    )
    head: torch.nn.Module
    if medusa:
        head = medusa_head.new_medusa_heads(target.hf_model, name, ids, args.medusa_num_heads, args.medusa_num_layers)
    elif eagle3:
        if start is not None:  # it trains its own draft LM head: it keeps its draft vocabulary
            if start.feature_layers != layers:
                raise ConfigError(
                    f"--init-from {args.init_from} reads target layers {list(start.feature_layers)}, not {list(layers)}"
                )
            ids = start.draft_ids
            coverage = choose_draft_vocab(sequences, len(ids), target.info.vocab_size, given=ids)[1]
        head = eagle3_head.new_eagle3_head(target.hf_model, name, ids, layers)
    else:  # a head started from one in the EAGLE authors' layout keeps it
        if args.authors_layout and start is not None and (start.config.input_norm or start.config.fc_bias):
            from ..drafters.heads.eagle_layout import fc_input_rms, to_authors_layout

            rms = fc_input_rms(start, sequences)
            to_authors_layout(start, rms)
            print(f"specdec: the head's input norm folded into its attention at rms {rms:.3f}", file=sys.stderr)
        layout = start.config if start is not None else None
        head = eagle_head.new_head(
            target.hf_model,
            name,
            ids,
            input_norm=not args.authors_layout and (layout is None or layout.input_norm),
            fc_bias=not args.authors_layout and (layout is None or layout.fc_bias),
        )
    if start is not None:  # the draft vocabulary (frozen LM head rows) is this data's
        head.load_state_dict(start.state_dict())
    print(
        f"specdec: draft vocabulary of {len(ids)} tokens covers {coverage:.1%} of the target's choices", file=sys.stderr
    )
    return head, coverage, settings, objective
