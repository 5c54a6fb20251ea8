"""The head `specdec train-drafter` trains: the target layers it reads (and those its data keeps), and the head
itself for --kind, resumed from --out, started from --init-from's weights, or new."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def stored_layers(args, target, layers: tuple[int, ...]) -> tuple[int, ...]:
    """The layers whose inputs the data keeps: an EAGLE head's data also keeps an EAGLE-3 head's default layers,
    so that one extraction trains either kind."""
    from ..drafters.heads.eagle3_head import default_feature_layers

    if layers or args.kind == "medusa":
        return layers
    return default_feature_layers(target.info.num_layers)


def feature_layers(args, target) -> tuple[int, ...]:
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


def head_to_train(args, target, name: str, sequences: list[dict], layers: tuple[int, ...] = ()):
    """(head, draft vocabulary coverage or None when resuming, settings, objective) for --kind."""
    from ..drafters.heads import eagle3_head, eagle3_loading, eagle_head, eagle_loading, medusa_head
    from ..drafters.heads.eagle_layout import in_authors_layout
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
        if args.authors_layout and not in_authors_layout(resumed.config):
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
    else:
        head = _eagle_head(args, target, name, ids, start, sequences)
    if start is not None:  # the draft vocabulary (frozen LM head rows) is this data's
        head.load_state_dict(start.state_dict())
    print(
        f"specdec: draft vocabulary of {len(ids)} tokens covers {coverage:.1%} of the target's choices", file=sys.stderr
    )
    return head, coverage, settings, objective


def _eagle_head(args, target, name: str, ids: torch.Tensor, start: Any, sequences: list[dict]):
    """A new EAGLE head over the draft vocabulary `ids`, in the layout of `start` (an EagleHead to take the weights
    of, or None), or in the EAGLE authors' layout with --authors-layout: `start` is then turned into that layout
    first, its norm folded into its attention at the rms measured on `sequences`."""
    from ..drafters.heads import eagle_head
    from ..drafters.heads.eagle_layout import fc_input_rms, in_authors_layout, to_authors_layout

    if args.authors_layout and start is not None and not in_authors_layout(start.config):
        rms = fc_input_rms(start, sequences)
        to_authors_layout(start, rms)
        print(f"specdec: the head's input norm folded into its attention at rms {rms:.3f}", file=sys.stderr)
    if start is not None:  # in the layout asked for, now
        return eagle_head.new_head(
            target.hf_model, name, ids, input_norm=start.config.input_norm, fc_bias=start.config.fc_bias
        )
    own = not args.authors_layout
    return eagle_head.new_head(target.hf_model, name, ids, input_norm=own, fc_bias=own)
