"""The target's features for a drafter that reads them (EAGLE heads): the rows of a request's prefill and of each
verified step, put in the layout its drafter reads (drafters.base.features_in_layout), observed by the drafter and
kept on the request where the prefix cache will want them. Plain decoding and drafters that read no features never
come here (the scheduler calls in only where request.needs_features)."""

from __future__ import annotations

import torch

from .drafters.base import features_in_layout
from .request import Request


def observe_prompt_features(request: Request, hidden: torch.Tensor | None, layers: tuple[int, ...] | None) -> None:
    """hidden: a prefill pass's rows of the request (rows, H + A*H) for the pass's feature `layers`: the rest of its
    prompt, or one chunk of it. The drafter is given them after any rows a prefix cache restored that it has not
    been given yet (request.features, where the request keeps every row so far as one tensor for the prefix cache)."""
    assert request.drafter is not None and hidden is not None and layers is not None  # a reader's pass returns them
    hidden = features_in_layout(hidden, layers, request.feature_layers)
    if request.features is not None:  # restored rows first, then the prefill's
        features = request.features
        kept = torch.cat([*features, hidden.to(features[0].device)]) if features else hidden
        request.features = [kept]
        hidden = kept[request.features_given :]
    request.drafter.observe(hidden)
    request.features_given += hidden.shape[0]


def observe_step_features(
    request: Request, hidden: torch.Tensor | None, rows: list[int], layers: tuple[int, ...] | None
) -> None:
    """hidden: a verify pass's rows (1 + k, H + A*H) for its feature `layers`; rows: those of the accepted path (the
    last token's, then each accepted draft's), the ones the drafter and the request keep."""
    assert request.drafter is not None and hidden is not None and layers is not None  # a reader's pass returns them
    kept = features_in_layout(hidden[rows], layers, request.feature_layers)
    request.drafter.observe(kept)
    if request.features is not None:
        request.features.append(kept)
