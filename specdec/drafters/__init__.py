"""Drafters, found by name: `create_drafter("ngram", target)`.

"none" is plain decoding (no drafter); "auto" picks the best drafter available for the target.
"""
from __future__ import annotations

import inspect
from typing import Callable

from ..errors import ConfigError
from .base import Draft, Drafter, DraftRequest

_FACTORIES: dict[str, Callable[..., Drafter | None]] = {}


def register(name: str):
    """Decorator: registers a factory `(target: LoadedModel, **options) -> Drafter`."""

    def wrap(factory):
        _FACTORIES[name] = factory
        return factory

    return wrap


def drafter_names() -> list[str]:
    return sorted(_FACTORIES)


def drafter_options() -> list[str]:
    """Every option some drafter takes (the keyword arguments of the registered factories)."""
    return sorted({n for f in _FACTORIES.values() for n in _takes(f)})


def create_drafter(name: str, target, **options) -> Drafter | None:
    """Builds the drafter `name` for the LoadedModel `target`; None for "none".

    `options` is one set shared by all drafters (a server hands the same options to every drafter a request may
    pick): each drafter takes those it knows. An option no drafter knows is an error that names it."""
    unknown = sorted(set(options) - set(drafter_options()))
    if unknown:
        raise ConfigError(f"unknown drafter option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; the "
                          f"drafters take: {', '.join(drafter_options())}")
    if name == "auto":
        name = auto_drafter_name(target, options)
    if name not in _FACTORIES:
        raise ConfigError(f"unknown drafter {name!r}; choose one of: auto, {', '.join(drafter_names())}")
    factory = _FACTORIES[name]
    takes_all = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(factory).parameters.values())
    return factory(target, **(options if takes_all else {k: v for k, v in options.items() if k in _takes(factory)}))


def _takes(factory) -> list[str]:
    """The keyword options a factory names (after its target)."""
    params = list(inspect.signature(factory).parameters.values())[1:]
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def auto_drafter_name(target, options: dict) -> str:
    """A draft model when one is given, else an EAGLE head or Medusa heads when given, else prompt lookup.

    The head shipped for smollm2-135m is not picked by default: on the CPU it was measured on, its drafts
    cost about as much as a target pass and are accepted too rarely to pay (docs/drafters.md).
    """
    if options.get("draft_model"):
        return "draft-model"
    if options.get("eagle_head"):
        return "eagle"
    if options.get("medusa_head"):
        return "medusa"
    return "ngram"


def bundled_head(model_name: str, kind: str = "eagle"):
    """The folder of the EAGLE head (kind "eagle"), EAGLE-3 head ("eagle3") or Medusa heads ("medusa") shipped with
    specdec for a built-in model, or None."""
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "assets" / "heads" / model_name
    if kind == "medusa":
        folder, weights = folder / "medusa", "medusa_heads.safetensors"
    elif kind == "eagle3":
        folder, weights = folder / "eagle3", "model.safetensors"
    else:
        weights = "eagle_head.safetensors"
    return folder if (folder / weights).is_file() else None


@register("none")
def _none(target) -> None:
    return None


@register("ngram")
def _ngram(target, min_n: int = 2, max_n: int = 4) -> Drafter:
    from .ngram import NgramDrafter

    return NgramDrafter(min_n=min_n, max_n=max_n)


@register("suffix")
def _suffix(target, suffix_index=None) -> Drafter:
    from .suffix import SuffixDrafter, SuffixIndex, tokenizer_id

    shared = SuffixIndex.open(suffix_index, target.info.vocab_size, tokenizer=tokenizer_id(target.tokenizer),
                              model=target.name) if suffix_index else None
    return SuffixDrafter(shared=shared)


@register("draft-model")
def _draft_model(target, draft_model=None, trust_remote_code: bool = False, draft_p_min: float = 0.0) -> Drafter:
    from ..models.loading import LoadedModel, load_model
    from .cross_tokenizer import CrossTokenizerDrafter, same_vocabulary
    from .draft_model import DraftModelDrafter, check_p_min

    check_p_min(draft_p_min)  # before a draft model loads
    if draft_model is None:
        raise ConfigError("drafter 'draft-model' needs a draft model (--draft-model NAME_OR_PATH)")
    if not isinstance(draft_model, LoadedModel):
        info = target.info
        draft_model = load_model(draft_model, device=str(info.device), dtype=str(info.dtype).replace("torch.", ""),
                                 trust_remote_code=trust_remote_code)
    if None in (target.tokenizer, draft_model.tokenizer) or same_vocabulary(target.tokenizer, draft_model.tokenizer):
        return DraftModelDrafter(draft_model.backend, target.info.vocab_size, p_min=draft_p_min)
    return CrossTokenizerDrafter(draft_model.backend, draft_model.tokenizer, target.tokenizer,  # through text
                                 p_min=draft_p_min)


@register("layerskip")
def _layerskip(target, layerskip_layers: int | None = None, draft_p_min: float = 0.0) -> Drafter:
    from .draft_model import DraftModelDrafter
    from .layerskip import DEFAULT_EXIT_LAYER, EarlyExit

    total = target.info.num_layers
    layers = layerskip_layers or min(DEFAULT_EXIT_LAYER, max(1, total // 2))
    if not 1 <= layers < total:
        raise ConfigError(f"layerskip needs 1 <= layers < {total} (the target's layer count), got {layers}")
    if type(target.backend).__name__ == "HFBackend":
        raise ConfigError("layerskip needs the kernels or torch backend (a Llama-family model)")
    return DraftModelDrafter(EarlyExit(target.backend, layers), target.info.vocab_size, name="layerskip",
                             p_min=draft_p_min)


def tree_shape(tree_width: int | None = None, tree_nodes: int | None = None) -> dict:
    """The tree options of the EAGLE and Medusa drafters: a fixed number of candidates per level (None: chosen
    from the measured verify costs) and a fixed number of nodes per tree (None: as many as pay, up to 48)."""
    for name, value in (("tree width", tree_width), ("tree nodes", tree_nodes)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
    shape = {"width": tree_width} if tree_width else {}
    return shape | ({"max_nodes": tree_nodes, "fixed_size": True} if tree_nodes else {})


@register("eagle")
def _eagle(target, eagle_head=None, tree: bool = True, tree_width=None, tree_nodes=None,
           calibrate_trees: bool = False) -> Drafter:
    return _eagle_drafter(target, eagle_head or bundled_head(target.name), tree, "", tree_shape(tree_width, tree_nodes),
                          calibrate_trees)


@register("eagle3")
def _eagle3(target, eagle_head=None, tree: bool = True, tree_width=None, tree_nodes=None,
            calibrate_trees: bool = False) -> Drafter:
    """`eagle` with an EAGLE-3 head: the one given (which must be one), else the one shipped for the model."""
    return _eagle_drafter(target, eagle_head or bundled_head(target.name, "eagle3"), tree, "3",
                          tree_shape(tree_width, tree_nodes), calibrate_trees)


def _eagle_drafter(target, folder, tree: bool, version: str, shape: dict, calibrate: bool = False) -> Drafter:
    """The EAGLE drafter of the head in `folder` (EAGLE-1/2 or EAGLE-3, told by its files; version "3": it must
    be EAGLE-3). The head runs on the CPU: on the kernels where they run, else in torch, in bfloat16 for a
    bfloat16 target, else float32. An EAGLE-3 head makes the target return the inputs of the layers it reads."""
    from pathlib import Path

    import torch

    from ..kernels import KernelUnavailable
    from .eagle import EagleDrafter
    from .eagle3_head import is_eagle3_folder, load_eagle3_head
    from .eagle_head import load_head
    from .eagle_kernels import KernelEagle3Head, KernelEagleHead, kernel_head_problem

    kind = f"--kind eagle{version} " if version else ""
    name = f"eagle{version}"
    if calibrate:
        from .calibration import Calibration

        shape = {**shape, "calibration": Calibration()}
    if folder is None:
        raise ConfigError(f"no EAGLE{'-' + version if version else ''} head is known for {target.name!r}: train one "
                          f"with `specdec train-drafter {kind}--model {target.name} --out DIR` and pass "
                          f"--eagle-head DIR")
    eagle3 = is_eagle3_folder(Path(folder))
    if version and not eagle3:
        raise ConfigError(f"{folder} holds no EAGLE-3 head (config.json with an Eagle3 architecture); use drafter "
                          f"'eagle' for EAGLE-1/2 heads")
    head = read_head(load_eagle3_head if eagle3 else load_head, folder, target)
    columns = target.backend.add_feature_layers(head.feature_layers)  # EAGLE-1/2: the final state
    bfloat16 = target.info.dtype == torch.bfloat16
    if target.info.device.type == "cpu" and kernel_head_problem(head.config) is None:
        try:
            view = (KernelEagle3Head if eagle3 else KernelEagleHead)(head, bfloat16=bfloat16)
            return EagleDrafter(view, tree=tree, columns=columns, name=name, **shape)
        except KernelUnavailable:
            pass  # the kernels failed to build here: torch's products
    return EagleDrafter(head.to(torch.bfloat16) if bfloat16 else head, tree=tree, columns=columns, name=name, **shape)


@register("medusa")
def _medusa(target, medusa_head=None, tree: bool = True, tree_width=None, tree_nodes=None) -> Drafter:
    import torch

    from ..kernels import KernelUnavailable
    from .medusa import MedusaDrafter
    from .medusa_head import load_medusa_heads
    from .medusa_kernels import KernelMedusaHeads, kernel_heads_problem

    folder = medusa_head or bundled_head(target.name, "medusa")
    if folder is None:
        raise ConfigError(f"no Medusa heads are known for {target.name!r}: train them with `specdec train-drafter "
                          f"--kind medusa --model {target.name} --out DIR` and pass --medusa-head DIR")
    shape = tree_shape(tree_width, tree_nodes)
    heads = read_head(load_medusa_heads, folder, target)
    info = target.info
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

        raise IncompatibleDraftError(f"cannot load the head in {folder}: {type(exc).__name__}: "
                                     f"{first_line(exc)[:300]}") from None


SELECT_DEFAULT = ("eagle", "medusa", "ngram", "suffix")  # candidates of "select", those available for the target


@register("select")
def _select(target, select_from=None, **options) -> Drafter:
    from .select import SelectingDrafter

    if select_from:
        names = [n.strip() for n in select_from.split(",")] if isinstance(select_from, str) else list(select_from)
        bad = [n for n in names if n in ("select", "auto", "none") or n not in _FACTORIES]
        if bad or not all(names):
            raise ConfigError(f"--select-from takes drafter names other than select, auto and none, got {select_from!r}")
    else:
        heads = {"eagle": options.get("eagle_head") or bundled_head(target.name),
                 "medusa": options.get("medusa_head") or bundled_head(target.name, "medusa")}
        names = [n for n in SELECT_DEFAULT if heads.get(n, True)]
    return SelectingDrafter([create_drafter(n, target, **options) for n in names])


__all__ = ["Draft", "Drafter", "DraftRequest", "create_drafter", "drafter_names", "register"]
