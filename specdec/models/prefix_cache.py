"""Prefix caching: finished sequences' KV caches stay in idle slots, so that a later prompt that starts with the
same tokens (a system prompt, a chat's earlier turns, a document asked about again) skips their prefill.

Exact, not approximate: a backend says how many of a sequence's cached positions were computed just as a fresh
prefill computes them (`exact_prefix_rows`), only those are kept, and the rest of a later prompt is prefilled as
a first pass. On specdec's CPU kernels a prompt's output is then the same, token for token and logit for logit,
whether its prefix came from the cache or not. Entries live only in slots no running sequence needs: taking a
slot for a new sequence evicts the least recently used entry first (PooledCaches.new_cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..tokens import common_prefix
from .backend import SequenceCache

MIN_PREFIX_TOKENS = 16  # shorter matches are prefilled: a copy of the slot's rows would save next to nothing


@dataclass
class _Entry:
    tokens: list[int]  # the token ids whose keys and values cache.slot holds, at positions 0..len-1
    cache: SequenceCache
    features: torch.Tensor | None = None  # (len(tokens), H + A*H) the target's hidden states, when they were kept
    feature_layers: tuple[int, ...] = ()  # the A layers whose inputs follow the final state in `features`


class PrefixCache:
    """Up to `max_entries` parked caches of one pooled backend, least recently used first."""

    def __init__(self, backend, max_entries: int, min_tokens: int = MIN_PREFIX_TOKENS):
        self.backend = backend
        self.max_entries = max_entries
        self.min_tokens = min_tokens
        self.entries: list[_Entry] = []  # oldest use first

    def __len__(self) -> int:
        return len(self.entries)

    def claim(
        self, prompt_ids: list[int], feature_layers: tuple[int, ...] | None = None
    ) -> tuple[SequenceCache, torch.Tensor | None] | None:
        """(a cache holding the longest stored prefix of `prompt_ids`, marked `restored`; with `feature_layers`
        (not None), that prefix's hidden states (n, H + A*H) laid out for them, from entries that kept those).
        Never the prompt's last token, which the prefill must score; None when no entry shares at least `min_tokens`
        with it. The entry is copied into a free slot (freed from the least recently used other entry if need be) and kept; when it is the only one
        and no slot is free, it is handed over itself."""
        limit = len(prompt_ids) - 1
        best, length = None, 0
        wanted = tuple(feature_layers) if feature_layers is not None else None
        for entry in self.entries:
            if wanted is not None and (entry.features is None or entry.feature_layers != wanted):
                continue  # kept without features, or with those of other layers
            n = common_prefix(entry.tokens, prompt_ids, limit)
            if n > length:
                best, length = entry, n
        if best is None or length < self.min_tokens:
            return None
        self.entries.remove(best)
        pool = self.backend.pool
        if not pool.has_free:
            self.evict_oldest()
        if pool.has_free:
            cache = pool.acquire()
            self.backend.copy_cache(best.cache, cache, length)
            self.entries.append(best)  # now the most recently used
        else:
            cache = best.cache
            self.backend.truncate(cache, length)
        cache.in_prompt = True
        return cache, best.features[:length] if wanted is not None and best.features is not None else None

    def park(
        self,
        tokens: list[int],
        cache: SequenceCache,
        features: torch.Tensor | None = None,
        feature_layers: tuple[int, ...] = (),
    ) -> bool:
        """Keeps the first len(tokens) positions of a finished sequence's cache (and their hidden states
        `features` (>= len(tokens), H + A*H) for the A `feature_layers`, for requests whose drafter reads them);
        False (the caller releases it) when they are too few to be worth a slot or the cache keeps no entries."""
        if self.max_entries <= 0 or len(tokens) < self.min_tokens:
            return False
        for entry in list(self.entries):  # an entry this one extends is redundant (unless it alone has features)
            if (
                len(entry.tokens) <= len(tokens)
                and tokens[: len(entry.tokens)] == entry.tokens
                and (features is not None or entry.features is None)
            ):
                self._drop(entry)
        self.backend.truncate(cache, len(tokens))
        kept = None if features is None else features[: len(tokens)]
        self.entries.append(_Entry(list(tokens), cache, kept, tuple(feature_layers)))
        while len(self.entries) > self.max_entries:
            self.evict_oldest()
        return True

    def evict_oldest(self) -> bool:
        """Frees the least recently used entry's slot; False when there is none."""
        if not self.entries:
            return False
        self._drop(self.entries[0])
        return True

    def clear(self) -> None:
        while self.entries:
            self._drop(self.entries[0])

    def _drop(self, entry: _Entry) -> None:
        self.entries.remove(entry)
        self.backend.pool.release(entry.cache)
