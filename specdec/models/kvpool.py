"""A static KV cache of fixed slots, one sequence per slot: rollback is resetting a length."""

from __future__ import annotations

import math
import mmap
from typing import Any

import torch

from .backend import SequenceCache


class KVPool:
    """Keys and values (layers, slots, kv_heads, capacity, head_dim); the pool grows a slot at a time."""

    def __init__(
        self,
        layers: int,
        slots: int,
        kv_heads: int,
        capacity: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
        zeroed: bool = True,
    ):
        self.capacity = capacity
        self.zeroed = zeroed
        shape = (layers, slots, kv_heads, capacity, head_dim)
        self.keys = self._make(shape, dtype, device)
        self.values = self._make(shape, dtype, device)
        self.slots = slots
        self._free = list(range(slots - 1, -1, -1))
        self._live: dict[int, SequenceCache] = {}

    def acquire(self) -> SequenceCache:
        """A free slot; when all are taken the pool doubles (copying only what live sequences hold)."""
        if not self._free:
            self._grow(2 * self.slots)
        cache = SequenceCache(length=0, slot=self._free.pop())
        self._live[cache.slot] = cache
        return cache

    def release(self, cache: SequenceCache) -> None:
        if cache.slot not in self._free:
            self._free.append(cache.slot)
        self._live.pop(cache.slot, None)
        cache.length = 0

    @staticmethod
    def truncate(cache: SequenceCache, length: int) -> None:
        cache.length = min(cache.length, length)

    @torch.inference_mode()
    def compact(self, cache: SequenceCache, start: int, keep: list[int]) -> None:
        """Moves entries start + keep[i] to start + i (keep ascending) and sets the length after them."""
        # copied without waiting: on a GPU a blocking copy from the host would synchronise every step
        src = torch.tensor([start + i for i in keep]).to(self.keys.device, non_blocking=True)
        dst = slice(start, start + len(keep))
        for tensor in (self.keys, self.values):
            tensor[:, cache.slot, :, dst] = tensor[:, cache.slot].index_select(2, src)
        cache.length = start + len(keep)

    @property
    def has_free(self) -> bool:
        return bool(self._free)

    @torch.inference_mode()
    def copy(self, src: SequenceCache, dst: SequenceCache, length: int | None = None) -> None:
        """dst holds src's first `length` entries (default: all of them)."""
        length = src.length if length is None else min(length, src.length)
        rows = self._rows_held(length)
        for tensor in (self.keys, self.values):
            tensor[:, dst.slot, :, :rows] = tensor[:, src.slot, :, :rows]
        dst.length = length

    def _rows_held(self, length: int) -> int:
        """Rows to move for a sequence of `length` tokens: a multiple of 16 covers any layout whose first n
        positions occupy the first n rows' memory, the kernels' blocked keys included."""
        return min(self.capacity, -(-length // 16) * 16)

    def _make(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A cache tensor, its pages resident from the start where the pool is `zeroed`. On the CPU it lies on
        fresh anonymous pages (a private mapping: zeros, resident only where written). torch.empty may instead
        take heap memory freed earlier and still resident: a load's packing frees hundreds of megabytes, and a
        Llama-3.2-1B file's keys or values (134 MB) landing there added that much to the load's resident memory
        in some processes and not in others."""
        if device.type != "cpu" or not hasattr(mmap, "MAP_PRIVATE"):  # a GPU's memory; Windows
            return (torch.zeros if self.zeroed else torch.empty)(shape, dtype=dtype, device=device)
        count = math.prod(shape)
        pages = mmap.mmap(-1, max(1, count * dtype.itemsize), flags=mmap.MAP_PRIVATE)  # private: not shared memory
        tensor = torch.frombuffer(pages, dtype=dtype, count=count).view(shape)
        return tensor.zero_() if self.zeroed else tensor

    def _grow(self, slots: int) -> None:
        """Reallocates for `slots`; copies the rows each live slot holds."""
        old = self.slots
        for name in ("keys", "values"):
            current = getattr(self, name)
            bigger = self._make((current.shape[0], slots, *current.shape[2:]), current.dtype, current.device)
            for slot, cache in self._live.items():
                rows = self._rows_held(cache.length)
                bigger[:, slot, :, :rows] = current[:, slot, :, :rows]
            setattr(self, name, bigger)
        self._free = list(range(slots - 1, old - 1, -1)) + self._free
        self.slots = slots


class PooledCaches:
    """Cache methods of a backend (CausalLM) whose sequences live in `self.pool`, a KVPool; optionally a prefix
    cache (prefix_cache.py) parks finished sequences in the slots no running one needs."""

    pool: KVPool
    prefix_cache: Any = None  # a PrefixCache, once enable_prefix_cache made one
    copies_caches = True

    def enable_prefix_cache(self, max_entries: int) -> bool:
        """Keeps up to `max_entries` finished sequences' caches for later prompts with the same beginning
        (0: none); whether any are kept."""
        from .prefix_cache import PrefixCache

        if self.prefix_cache is not None:
            self.prefix_cache.clear()
        self.prefix_cache = PrefixCache(self, max_entries) if max_entries > 0 else None
        return self.prefix_cache is not None

    def new_cache(self) -> SequenceCache:
        if self.prefix_cache is not None and not self.pool.has_free:
            self.prefix_cache.evict_oldest()  # parked sequences only use slots no running one needs
        return self.pool.acquire()

    def release(self, cache: SequenceCache) -> None:
        self.pool.release(cache)

    def truncate(self, cache: SequenceCache, length: int) -> None:
        self.pool.truncate(cache, length)

    def compact(self, cache: SequenceCache, start: int, keep: list[int]) -> None:
        self.pool.compact(cache, start, keep)

    def copy_cache(self, src: SequenceCache, dst: SequenceCache, length: int | None = None) -> None:
        """dst (a fresh cache) gets src's first `length` keys and values (default: all): sequences with the same
        prompt prefill it once."""
        self.pool.copy(src, dst, length)


def rope_tables(hf_model, positions: int, kind: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (positions, rotated dims) in float32, computed as transformers' rotary embedding does; rotated
    dims: the head dim, or its first part where the config rotates only that (partial_rotary_factor). The frequencies
    are those it starts with (LongRoPE's short factors), not whatever a long pass of it left in inv_freq. kind: a layer
    type, for rotary embeddings with a table per layer type (Gemma 3's)."""
    rotary = hf_model.model.rotary_emb
    prefix = f"{kind}_" if kind else ""
    inv_freq = getattr(rotary, prefix + "original_inv_freq", None)
    inv_freq = getattr(rotary, prefix + "inv_freq") if inv_freq is None else inv_freq
    pos = torch.arange(positions, dtype=torch.float32, device=inv_freq.device)
    freqs = pos[:, None] * inv_freq.float()[None, :]  # (P, rotated / 2)
    angles = torch.cat((freqs, freqs), dim=-1)  # (P, rotated)
    scale = getattr(rotary, prefix + "attention_scaling", 1.0)
    return angles.cos() * scale, angles.sin() * scale
