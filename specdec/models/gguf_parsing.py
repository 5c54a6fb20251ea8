"""A GGUF file's metadata parsed once a load, and about four times faster, by the gguf package's own reader.

`GGUFReader` maps the file with `numpy.memmap` and parses each metadata value through slices of that map: a
151,936-token vocabulary and its merges are over a million slices, and each slice of a memmap pays numpy's memmap
bookkeeping (`__array_finalize__`, `__getitem__`), 80% of the parse. A plain ndarray view of the same mapping gives
the same bytes without it: Qwen3-0.6B's file parsed in 1.9 s instead of 8.1 s on a Zen 3. The reader keeps its
mapping alive through the view's base, as before.

A load reads a file three times (specdec's reader for the tensors, transformers' config and its tokenizer, each
through `GGUFReader`, which transformers imports from the gguf package when it is called). So a load runs inside
`fast_gguf_parsing()`, which gives the gguf package's reader module a numpy whose `memmap` returns that view, and
makes `gguf.GGUFReader` hand out one reader per file for the block's length (readers opened for reading only: none
of them writes); both are put back when the block ends, and the shared readers are dropped with it.
"""

from __future__ import annotations

import os
import threading
import types
from contextlib import contextmanager

import numpy as np

_LOCK = threading.RLock()


class _PlainMapNumpy(types.ModuleType):
    """numpy, whose memmap returns a plain ndarray view of the mapping (what GGUFReader reads through)."""

    def __init__(self):
        super().__init__("numpy")

    def __getattr__(self, name: str):
        return getattr(np, name)

    @staticmethod
    def memmap(*args, **kwargs) -> np.ndarray:
        return np.memmap(*args, **kwargs).view(np.ndarray)


@contextmanager
def fast_gguf_parsing():
    """Within the block, GGUFReader (specdec's, transformers') maps files as plain ndarray views, and a file opened
    for reading again gets the reader made first. Blocks may nest; readers made inside keep working after it."""
    import gguf
    from gguf import gguf_reader

    with _LOCK:
        numpy_before, reader_before = gguf_reader.np, gguf.GGUFReader
        readers: dict[tuple, object] = {}

        def shared_reader(path, mode="r"):
            if mode != "r":
                return reader_before(path, mode)
            stat = os.stat(path)
            key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
            if key not in readers:
                readers[key] = reader_before(path, mode)
            return readers[key]

        gguf_reader.np, gguf.GGUFReader = _PlainMapNumpy(), shared_reader
        try:
            yield
        finally:
            gguf_reader.np, gguf.GGUFReader = numpy_before, reader_before
