"""A request's KV cache handed to and from the backend's prefix cache (models/prefix_cache.py): at its start, the
cache of an earlier request that began as its prompt does (with that request's hidden states, for a drafter that
reads features); at its end, its cache parked for later prompts. request.open_request and close_request call in only
where the backend has a prefix cache, so plain decoding without one never runs this file."""

from __future__ import annotations

import torch


def claim_prefix(prefix, request):
    """For a Request: the cache of an earlier request that began as this prompt does, from the prefix cache (for a
    drafter that reads features, one that kept its hidden states, handed on with the prefill's); None when there is
    none, or when the request asks for every prompt row's logprobs."""
    if request.prefill_all_logits:
        return None
    claimed = prefix.claim(request.tokens, request.feature_layers if request.needs_features else None)
    if claimed is None:
        return None
    cache, features = claimed
    if features is not None:
        request.features = [features]  # the restored rows' hidden states, for the drafter at the prefill
    return cache


def park(prefix, backend, request) -> bool:
    """Hands a Request's cache to the prefix cache (its rows a later prefill would compute identically); False
    where the prefix cache did not take it (the caller frees it)."""
    rows = min(len(request.tokens), backend.exact_prefix_rows(request.cache, request.prompt_len))
    features = torch.cat(request.features) if request.features else None  # none: it ended before its prefill
    if features is not None and features.shape[0] < rows:
        features = None
    return prefix.park(request.tokens[:rows], request.cache, features, request.feature_layers)
