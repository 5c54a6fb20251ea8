"""The drafter contract: every drafter declares the protocol's members, and each drafter's options are a frozen
dataclass that refuses bad values when it is made, naming them."""
import dataclasses
import importlib
import inspect

import pytest

from specdec.drafters import _FACTORIES, drafter_options
from specdec.drafters.base import Drafter
from specdec.drafters.options import (DraftModelOptions, EagleOptions, LayerSkipOptions, LookaheadOptions,
                                      MedusaOptions, NgramOptions, SelectOptions, SuffixOptions)
from specdec.errors import ConfigError

MEMBERS = ("name", "feature_layers", "needs_scores", "sizing", "begin", "propose", "observe",
           "scored", "learn", "end", "fork")


def test_every_built_in_drafter_declares_the_protocol():
    for module in ("models.cross_tokenizer", "models.draft_model", "heads.eagle", "lookup.lookahead", "heads.medusa",
                   "lookup.ngram", "models.quantized", "routing.select", "lookup.suffix", "lookup.recycle"):
        importlib.import_module(f"specdec.drafters.{module}")
    classes = [c for c in _all_subclasses(Drafter) if c.__module__.startswith("specdec.")]
    assert len(classes) >= 7
    for cls in classes:
        assert not inspect.isabstract(cls), cls
        assert all(hasattr(cls, m) for m in MEMBERS), cls
        assert "budget" in inspect.signature(cls.propose).parameters, cls


def test_options_are_frozen_dataclasses_and_every_field_is_a_known_option():
    for entry in _FACTORIES.values():
        if entry.options is not None:
            assert dataclasses.is_dataclass(entry.options) and entry.options.__dataclass_params__.frozen
    assert {"min_n", "max_n", "eagle_head", "tree_width", "select_from", "draft_p_min"} <= set(drafter_options())
    with pytest.raises(dataclasses.FrozenInstanceError):
        NgramOptions().min_n = 3


@pytest.mark.parametrize("make,message", [
    (lambda: NgramOptions(min_n=3, max_n=2), "ngram sizes"),
    (lambda: SuffixOptions(suffix_index=5), "suffix_index must be a path"),
    (lambda: DraftModelOptions(), "needs a draft model"),
    (lambda: DraftModelOptions(draft_model="m", draft_p_min=1.0), "draft_p_min"),
    (lambda: LayerSkipOptions(layerskip_layers="4"), "layerskip layers must be an integer"),
    (lambda: EagleOptions(tree="yes"), "tree must be true or false"),
    (lambda: EagleOptions(tree_nodes=0), "tree nodes must be an integer >= 1"),
    (lambda: MedusaOptions(tree_width=2.5), "tree width must be an integer >= 1"),
    (lambda: SelectOptions(select_from="ngram,none"), "--select-from"),
    (lambda: LookaheadOptions(lookahead_guesses=33), "lookahead_guesses"),
])
def test_bad_option_values_are_refused_when_made(make, message):
    with pytest.raises(ConfigError, match=message):
        make()


def _all_subclasses(cls) -> list[type]:
    return [sub for c in cls.__subclasses__() for sub in [c] + _all_subclasses(c)]
