"""Each drafter's options: one frozen dataclass per drafter that takes any, validated at construction, so that a bad
value is refused (a ConfigError naming it) before anything loads. create_drafter (drafters/__init__.py) hands each
drafter the options its dataclass names; an option no drafter names is an error too."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..errors import ConfigError


def check_p_min(p_min: float) -> float:
    """p_min itself, or a ConfigError unless 0 <= p_min < 1 (1 would stop every draft at one token whatever q)."""
    if (
        isinstance(p_min, bool)
        or not isinstance(p_min, (int, float))
        or not math.isfinite(p_min)
        or not 0.0 <= p_min < 1.0
    ):
        raise ConfigError(f"draft_p_min must be in [0, 1), got {p_min!r}")
    return float(p_min)


def _check_flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")


def _check_path(name: str, value) -> None:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name} must be a path, got {value!r}")


@dataclass(frozen=True)
class NgramOptions:
    """Prompt lookup: the longest suffix n-gram of the context found earlier in it, n from max_n down to min_n."""

    min_n: int = 2
    max_n: int = 4

    def __post_init__(self) -> None:
        if not (1 <= self.min_n <= self.max_n <= 32):
            raise ConfigError(
                f"ngram sizes must satisfy 1 <= min_n <= max_n <= 32, got min_n={self.min_n}, max_n={self.max_n}"
            )


@dataclass(frozen=True)
class SuffixOptions:
    """The suffix drafter: suffix_index, an index file shared across runs (`specdec suffix-index build`)."""

    suffix_index: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        _check_path("suffix_index", self.suffix_index)


@dataclass(frozen=True)
class DraftModelOptions:
    """A draft model: its name, folder or LoadedModel; draft_p_min: drafting stops after a token the draft gives
    less than this probability (0: off)."""

    draft_model: object = None
    trust_remote_code: bool = False
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        check_p_min(self.draft_p_min)  # before a draft model loads
        _check_flag("trust_remote_code", self.trust_remote_code)
        if self.draft_model is None:
            raise ConfigError("drafter 'draft-model' needs a draft model (--draft-model NAME_OR_PATH)")


@dataclass(frozen=True)
class QuantizedOptions:
    """The target's 4-bit copy: draft_p_min as for a draft model."""

    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        check_p_min(self.draft_p_min)


@dataclass(frozen=True)
class LayerSkipOptions:
    """Layer-skip: the target's first layerskip_layers layers draft (None or 0: the default depth); draft_p_min as
    for a draft model."""

    layerskip_layers: int | None = None
    draft_p_min: float = 0.0

    def __post_init__(self) -> None:
        layers = self.layerskip_layers  # its range depends on the target: create_drafter checks it
        if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int)):
            raise ConfigError(f"layerskip layers must be an integer, got {layers!r}")
        check_p_min(self.draft_p_min)


@dataclass(frozen=True)
class TreeOptions:
    """Drafters that draft trees or chains (tree False): a fixed number of candidates per level (tree_width; None:
    chosen from the measured verify costs) and a fixed number of nodes per tree (tree_nodes; None: as many as pay,
    up to 48)."""

    tree: bool = True
    tree_width: int | None = None
    tree_nodes: int | None = None

    def __post_init__(self) -> None:
        _check_flag("tree", self.tree)
        for name, value in (("tree width", self.tree_width), ("tree nodes", self.tree_nodes)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")

    def shape(self) -> dict:
        """The drafter's keyword arguments for these sizes (EagleDrafter's and MedusaDrafter's width, max_nodes and
        fixed_size)."""
        shape = {"width": self.tree_width} if self.tree_width else {}
        return shape | ({"max_nodes": self.tree_nodes, "fixed_size": True} if self.tree_nodes else {})


@dataclass(frozen=True)
class EagleOptions(TreeOptions):
    """EAGLE (and EAGLE-3): the head's folder (None: the one shipped for the model); calibrate_trees: score and size
    trees by the acceptance observed for the head's confidences."""

    eagle_head: str | os.PathLike | None = None
    calibrate_trees: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_path("eagle_head", self.eagle_head)
        _check_flag("calibrate_trees", self.calibrate_trees)


@dataclass(frozen=True)
class MedusaOptions(TreeOptions):
    """Medusa: the heads' folder (None: the set shipped for the model)."""

    medusa_head: str | os.PathLike | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_path("medusa_head", self.medusa_head)


@dataclass(frozen=True)
class SelectOptions:
    """The select drafter: its candidates' names (a comma-separated string or a list; None: those available of
    the default set). Which names are drafters is the registry's to say (create_drafter)."""

    select_from: str | tuple | list | None = None

    def __post_init__(self) -> None:
        names = self.names
        if names is not None and (not names or not all(names) or {"select", "auto", "none"} & set(names)):
            raise bad_select_from(self.select_from)

    @property
    def names(self) -> tuple[str, ...] | None:
        if not self.select_from:
            return None
        given = self.select_from
        return tuple(n.strip() for n in given.split(",")) if isinstance(given, str) else tuple(given)


def bad_select_from(value) -> ConfigError:
    return ConfigError(f"--select-from takes drafter names other than select, auto and none, got {value!r}")


LOOKAHEAD_DEFAULTS = {"lookahead_window": 4, "lookahead_ngram": 3, "lookahead_guesses": 6}
LOOKAHEAD_LIMITS = {"lookahead_window": ("W", 2, 32), "lookahead_ngram": ("N", 2, 8), "lookahead_guesses": ("G", 1, 32)}


@dataclass(frozen=True)
class LookaheadOptions:
    """Lookahead decoding: the Jacobi window's width W (lookahead_window), the n-gram size N (lookahead_ngram, the
    window's depth plus one) and the most pooled n-grams verified per step G (lookahead_guesses); None: the
    default (LOOKAHEAD_DEFAULTS)."""

    lookahead_window: int | None = None
    lookahead_ngram: int | None = None
    lookahead_guesses: int | None = None

    def __post_init__(self) -> None:
        for name, (letter, low, high) in LOOKAHEAD_LIMITS.items():
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high
            ):
                raise ConfigError(
                    f"{name} (--{name.replace('_', '-')}, {letter}) must be an integer in "
                    f"[{low}, {high}], got {value!r}"
                )

    def sizes(self) -> tuple[int, int, int]:
        """(W, N, G), the defaults where not given."""
        w, n, g = (
            LOOKAHEAD_DEFAULTS[name] if getattr(self, name) is None else getattr(self, name)
            for name in LOOKAHEAD_LIMITS
        )
        return w, n, g
