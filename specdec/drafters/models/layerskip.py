"""Layer-skip self-speculation: the target's first L layers, its final norm and LM head draft.

No training and no extra weights. The early exit is a view of the target backend (forward with
layers=L) with caches of its own, driven like any draft model (drafters.models.draft_model).
"""

from __future__ import annotations

from ...models.backend import CausalLM

# capped at half the depth; the measured sweep on smollm2-135m is in docs/experiments/shipped-heads.md
DEFAULT_EXIT_LAYER = 15


class EarlyExit(CausalLM):
    """The first `layers` layers of a backend as a model of its own: several sequences in one pass where the backend
    runs them so (`batched`, forward_batch)."""

    def __init__(self, backend: CausalLM, layers: int):
        self.backend, self.layers = backend, layers
        self.info = backend.info
        self.batched = backend.batched

    def new_cache(self):
        return self.backend.new_cache()

    def release(self, cache) -> None:
        self.backend.release(cache)

    def truncate(self, cache, length: int) -> None:
        self.backend.truncate(cache, length)

    def forward(self, cache, input_ids, *, layers=None, **options):
        """The backend's forward over at most the first `layers` layers; every other option passed on."""
        return self.backend.forward(cache, input_ids, layers=self._exit(layers), **options)

    def forward_batch(self, caches, input_ids, *, layers=None, **options):
        """The backend's batched forward over at most the first `layers` layers; every other option passed on."""
        return self.backend.forward_batch(caches, input_ids, layers=self._exit(layers), **options)

    def _exit(self, layers: int | None) -> int:
        """The layers a pass runs: those asked for, never past the early exit."""
        return min(layers or self.layers, self.layers)
