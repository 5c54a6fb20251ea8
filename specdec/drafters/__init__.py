"""Drafters, found by name: `create_drafter("ngram", target)` (registry.py); here, the built-in drafters' factories.

"none" is plain decoding (no drafter); "auto" picks the best drafter available for the target (auto.py). Each drafter's
options are a frozen dataclass (options.py), validated before anything loads.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import Budget, Draft, Drafter, DraftRequest
from .registry import _FACTORIES, create_drafter, drafter_names, drafter_options, register
from .routing.auto import bundled_head, quantized_copy_problem
from .options import (
    DraftModelOptions,
    EagleOptions,
    LayerSkipOptions,
    LookaheadOptions,
    MedusaOptions,
    NgramOptions,
    QuantizedOptions,
    SelectOptions,
    SuffixOptions,
    bad_select_from,
)


@register("none")
def _none(target) -> None:
    return None


@register("ngram", NgramOptions)
def _ngram(target, options: NgramOptions) -> Drafter:
    from .lookup.ngram import NgramDrafter

    return NgramDrafter(min_n=options.min_n, max_n=options.max_n)


@register("recycle", NgramOptions)
def _recycle(target, options: NgramOptions) -> Drafter:
    from .lookup.recycle import RecycleDrafter

    return RecycleDrafter(min_n=options.min_n, max_n=options.max_n)


@register("suffix", SuffixOptions)
def _suffix(target, options: SuffixOptions) -> Drafter:
    from .lookup.suffix import SuffixDrafter, SuffixIndex, tokenizer_id

    shared = (
        SuffixIndex.open(
            options.suffix_index, target.info.vocab_size, tokenizer=tokenizer_id(target.tokenizer), model=target.name
        )
        if options.suffix_index
        else None
    )
    return SuffixDrafter(shared=shared)


@register("lookahead", LookaheadOptions)
def _lookahead(target, options: LookaheadOptions) -> Drafter:
    """Lookahead decoding: window W, n-gram size N, guess set G (None: the defaults, options.LOOKAHEAD_DEFAULTS)."""
    from .lookup.lookahead import LookaheadDrafter

    return LookaheadDrafter(*options.sizes())


@register("draft-model", DraftModelOptions)
def _draft_model(target, options: DraftModelOptions) -> Drafter:
    from ..models.loading import LoadedModel, load_model
    from .models.cross_tokenizer import CrossTokenizerDrafter, same_vocabulary
    from .models.draft_model import DraftModelDrafter

    draft_model, p_min = options.draft_model, options.draft_p_min
    if not isinstance(draft_model, LoadedModel):
        info = target.info
        draft_model = load_model(
            str(draft_model),
            device=str(info.device),
            dtype=str(info.dtype).replace("torch.", ""),
            trust_remote_code=options.trust_remote_code,
        )
    if None in (target.tokenizer, draft_model.tokenizer) or same_vocabulary(target.tokenizer, draft_model.tokenizer):
        return DraftModelDrafter(draft_model.backend, target.info.vocab_size, p_min=p_min)
    return CrossTokenizerDrafter(
        draft_model.backend,
        draft_model.tokenizer,
        target.tokenizer,  # through text
        p_min=p_min,
    )


@register("layerskip", LayerSkipOptions)
def _layerskip(target, options: LayerSkipOptions) -> Drafter:
    from .models.draft_model import DraftModelDrafter
    from .models.layerskip import DEFAULT_EXIT_LAYER, EarlyExit

    total = target.info.num_layers
    layers = options.layerskip_layers or min(DEFAULT_EXIT_LAYER, max(1, total // 2))
    if not 1 <= layers < total:
        raise ConfigError(f"layerskip needs 1 <= layers < {total} (the target's layer count), got {layers}")
    if not target.backend.early_exit:
        raise ConfigError("layerskip needs the kernels or torch backend (a Llama-family model)")
    return DraftModelDrafter(
        EarlyExit(target.backend, layers), target.info.vocab_size, name="layerskip", p_min=options.draft_p_min
    )


@register("quantized", QuantizedOptions)
def _quantized(target, options: QuantizedOptions) -> Drafter:
    from .models.quantized import QuantizedCopyDrafter

    problem = quantized_copy_problem(target)
    if problem:
        raise ConfigError(problem)
    return QuantizedCopyDrafter(target.backend, target.backend.four_bit_copy(), p_min=options.draft_p_min)


@register("eagle", EagleOptions)
def _eagle(target, options: EagleOptions) -> Drafter:
    return _eagle_drafter(target, options.eagle_head or bundled_head(target.name), "", options)


@register("eagle3", EagleOptions)
def _eagle3(target, options: EagleOptions) -> Drafter:
    """`eagle` with an EAGLE-3 head: the one given (which must be one), else the one shipped for the model."""
    return _eagle_drafter(target, options.eagle_head or bundled_head(target.name, "eagle3"), "3", options)


def _eagle_drafter(target, folder, version: str, options: EagleOptions) -> Drafter:
    """The EAGLE drafter of the head in `folder` (EAGLE-1/2 or EAGLE-3, told by its files; version "3": it must
    be EAGLE-3). On a CUDA target the head drafts there in its dtype (CUDA graphs: eagle_device.py); on a CPU, on
    the kernels where they run, else in torch, in bfloat16 for a bfloat16 target, else float32. An EAGLE-3 head
    declares the target layers it reads (Drafter.feature_layers)."""
    import torch

    from ..kernels import KernelUnavailable
    from ..models.backend import check_feature_layers
    from .heads.eagle import EagleDrafter
    from .heads.calibration import Calibration
    from .heads.eagle3_loading import is_eagle3_folder, load_eagle3_head
    from .heads.eagle_loading import load_head
    from .heads.eagle_kernels import KernelEagle3Head, KernelEagleHead, head_bits, kernel_head_problem

    kind, name = f"--kind eagle{version} " if version else "", f"eagle{version}"
    tree, shape = options.tree, options.shape()
    if options.calibrate_trees:
        shape = {**shape, "calibration": Calibration()}
    if folder is None:
        raise ConfigError(
            f"no EAGLE{'-' + version if version else ''} head is known for {target.name!r}: train one "
            f"with `specdec train-drafter {kind}--model {target.name} --out DIR` and pass "
            f"--eagle-head DIR"
        )
    eagle3 = is_eagle3_folder(folder)
    if version and not eagle3:
        raise ConfigError(
            f"{folder} holds no EAGLE-3 head (config.json with an Eagle3 architecture); use drafter "
            f"'eagle' for EAGLE-1/2 heads"
        )
    head = read_head(load_eagle3_head if eagle3 else load_head, folder, target)
    check_feature_layers(head.feature_layers, target.info.num_layers)  # asked of the target per pass, not set on it
    info, bfloat16 = target.info, target.info.dtype == torch.bfloat16
    if info.device.type == "cuda":
        return EagleDrafter(head.to(info.device, info.dtype), tree=tree, name=name, **shape)
    if info.device.type == "cpu" and kernel_head_problem(head.config) is None:
        try:
            bits = head_bits(target, head.config)
            view = (KernelEagle3Head if eagle3 else KernelEagleHead)(head, bfloat16=bfloat16, bits=bits)
            return EagleDrafter(view, tree=tree, name=name, **shape)
        except KernelUnavailable:
            pass  # the kernels failed to build here: torch's products
    return EagleDrafter(head.to(torch.bfloat16) if bfloat16 else head, tree=tree, name=name, **shape)


@register("medusa", MedusaOptions)
def _medusa(target, options: MedusaOptions) -> Drafter:
    import torch

    from ..kernels import KernelUnavailable
    from .heads.medusa import MedusaDrafter
    from .heads.medusa_head import load_medusa_heads
    from .heads.medusa_kernels import KernelMedusaHeads, kernel_heads_problem

    folder = options.medusa_head or bundled_head(target.name, "medusa")
    if folder is None:
        raise ConfigError(
            f"no Medusa heads are known for {target.name!r}: train them with `specdec train-drafter "
            f"--kind medusa --model {target.name} --out DIR` and pass --medusa-head DIR"
        )
    tree, shape = options.tree, options.shape()
    heads, info = read_head(load_medusa_heads, folder, target), target.info
    if info.device.type == "cpu" and kernel_heads_problem(heads) is None:
        try:
            return MedusaDrafter(KernelMedusaHeads(heads, bfloat16=info.dtype == torch.bfloat16), tree=tree, **shape)
        except KernelUnavailable:
            pass  # the kernels failed to build here: torch's products
    # elsewhere the heads run where the target's features are, in its dtype (float32 for float16 on CPUs)
    dtype = torch.float32 if info.device.type == "cpu" and info.dtype == torch.float16 else info.dtype
    return MedusaDrafter(heads.to(info.device, dtype), tree=tree, **shape)


def read_head(load, folder, target):
    """load(folder, target), with a damaged head (a bad config, missing tensors, wrong shapes) refused in one line
    naming its folder."""
    from ..errors import SpecdecError

    try:
        return load(folder, target)
    except SpecdecError:
        raise
    except (ValueError, KeyError, TypeError, RuntimeError, OSError) as exc:
        from ..errors import IncompatibleDraftError, first_line

        raise IncompatibleDraftError(
            f"cannot load the head in {folder}: {type(exc).__name__}: {first_line(exc)[:300]}"
        ) from None


SELECT_DEFAULT = ("eagle", "medusa", "ngram", "suffix")  # candidates of "select", those available for the target


@register("select", SelectOptions, passes_on=True)
def _select(target, options: SelectOptions, given: dict) -> Drafter:
    from .routing.select import SelectingDrafter

    names = options.names
    if names is not None and any(n not in _FACTORIES for n in names):
        raise bad_select_from(options.select_from)
    if names is None:
        heads = {
            "eagle": given.get("eagle_head") or bundled_head(target.name),
            "medusa": given.get("medusa_head") or bundled_head(target.name, "medusa"),
        }
        names = tuple(n for n in SELECT_DEFAULT if heads.get(n, True))
    made = [create_drafter(n, target, **given) for n in names]
    return SelectingDrafter([d for d in made if d is not None])  # "none" is no candidate (SelectOptions)


__all__ = [
    "Budget",
    "Draft",
    "Drafter",
    "DraftRequest",
    "_FACTORIES",
    "bundled_head",
    "create_drafter",
    "drafter_names",
    "drafter_options",
    "read_head",
    "register",
]
