"""The KV pool's memory (specdec/models/kvpool.py): on the CPU its caches lie on fresh anonymous pages, zeros that
become resident only where written (a zeroed pool is resident from the start), whatever the heap freed before."""
import sys

import pytest
import torch

from specdec.benchmarks.resident import resident_bytes
from specdec.models.kvpool import KVPool

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
SHAPE = dict(layers=4, slots=2, kv_heads=4, capacity=4096, head_dim=64)  # 16 MiB of float32 keys, as many values


def own_resident_bytes() -> int:
    """The process's anonymous resident pages, freed heap pages handed back first (resident_bytes)."""
    return resident_bytes()["own"]


def make(zeroed: bool, dtype=torch.float32) -> KVPool:
    return KVPool(**SHAPE, dtype=dtype, device=torch.device("cpu"), zeroed=zeroed)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cpu_pool_reads_zero_before_anything_is_written(dtype):
    pool = make(zeroed=False, dtype=dtype)
    assert pool.keys.is_contiguous() and pool.keys.dtype == dtype
    assert not pool.keys.any() and not pool.values.any()


@linux
def test_a_pool_is_resident_only_where_written_even_where_the_heap_freed_touched_memory():
    before = own_resident_bytes()
    # what a load's packing leaves: touched heap memory, freed below memory still held
    torch.ones(6 << 20).sum()  # 24 MiB freed at once: glibc then serves smaller blocks from its heap
    freed = [torch.ones(1 << 20) for _ in range(48)]  # 4 MiB each, 192 MiB touched
    held = torch.ones(1 << 18)  # noqa: F841 (above them in the heap)
    del freed
    pool = make(zeroed=False)  # torch.empty would take that memory, resident already: the next reading's trim keeps it
    size = 2 * pool.keys.numel() * pool.keys.element_size()
    assert own_resident_bytes() - before < size // 4
    pool.keys[:, 0, :, :16] = 1.0  # the first 16 rows of a slot: a page a (layer, head)
    assert own_resident_bytes() - before < size // 4


@linux
def test_a_zeroed_pool_is_resident_from_the_start():
    before = own_resident_bytes()
    pool = make(zeroed=True)
    size = 2 * pool.keys.numel() * pool.keys.element_size()
    assert own_resident_bytes() - before > 0.9 * size and not pool.keys.any()


@pytest.mark.parametrize("zeroed", [False, True])
def test_growing_keeps_what_live_slots_hold(zeroed):
    pool = make(zeroed)
    caches = [pool.acquire() for _ in range(2)]
    for cache, value in zip(caches, (3.0, 5.0)):
        pool.keys[:, cache.slot, :, :20] = value
        cache.length = 20
    third = pool.acquire()  # the pool doubles
    assert pool.slots == 4 and third.slot not in {c.slot for c in caches}
    for cache, value in zip(caches, (3.0, 5.0)):
        assert (pool.keys[:, cache.slot, :, :20] == value).all()
    assert not pool.keys[:, third.slot].any()
