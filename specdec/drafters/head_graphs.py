"""An EAGLE head's drafting steps (eagle_device.py) over buckets of shapes, captured as CUDA graphs on a GPU.

A bucket is one step's shape: a chain of k tokens, or a tree of depth x width candidates keeping `nodes`, and
the key window the head attends over (as models/pass_graphs.py: the smallest power of two from MIN_WINDOW that
holds the true pairs and the drafted ones, or the whole buffer). Every bucket reads the same static inputs, the
root hidden state (H,) and the cache length (), and writes its own outputs.

With capture on (CUDA), a bucket's step is warmed up on a side stream with the live inputs (its writes land past
the true pairs, in rows the step itself overwrites), captured once with torch.cuda.graph (all buckets share one
memory pool) and replayed; its outputs are cloned, since a later replay may overwrite them. With capture off (the
CPU) the same code runs directly. Graphs read the cache's buffer as it was at capture: when it grows, they are
captured again at their next use.
"""
from __future__ import annotations

import torch

from ..models.pass_graphs import MIN_WINDOW, key_windows, smallest_fitting
from .eagle_device import HeadCache, draft_chain, draft_tree

WARMUP_CALLS = 3


class HeadGraphs:
    """Runs a head's greedy chains and trees as shape-static steps over `cache`, captured where `capture`."""

    def __init__(self, head, cache: HeadCache, capture: bool, min_window: int = MIN_WINDOW):
        device = cache.keys.device
        if capture and device.type != "cuda":
            raise ValueError("CUDA graphs are captured on a CUDA device only")
        self.head, self.cache, self.capture, self.min_window = head, cache, capture, min_window
        self.root = torch.zeros(head.config.hidden_size, device=device, dtype=cache.keys.dtype)  # static input
        self.length = torch.zeros((), dtype=torch.long, device=device)  # static input
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._captured_for = None  # the cache buffer the graphs read
        self._memory_pool = None

    def chain(self, root: torch.Tensor, k: int) -> torch.Tensor:
        """The greedy chain of k token ids (k,) after root (H,), the head's output at the cache's last true pair."""
        return self._run(("chain", k), root, k - 1)[0]

    def tree(self, root: torch.Tensor, depth: int, width: int, nodes: int):
        """(token ids (N,), parents (N,), scores (N,)) of the most probable N = min(nodes, depth x width) nodes of a
        depth x width tree after root (H,) (eagle_device.draft_tree)."""
        return self._run(("tree", depth, width, min(nodes, depth * width)), root, depth * width)

    # ---- internals ------------------------------------------------------------------------------------------
    @torch.inference_mode()  # the cache is written in this mode only (EagleDrafter's observe and propose too)
    def _run(self, shape: tuple, root: torch.Tensor, drafted_rows: int) -> tuple[torch.Tensor, ...]:
        cache = self.cache
        cache.reserve(cache.length + drafted_rows + 1)
        window = smallest_fitting(key_windows(cache.capacity, self.min_window), cache.length + drafted_rows)
        self.length.fill_(cache.length)  # a kernel on CUDA, not a copy that would wait
        if not self.capture:
            return self._step(shape, window, root, self.length)
        self.root.copy_(root)
        if self._captured_for != cache.keys.data_ptr():
            self._graphs.clear()
            self._memory_pool = torch.cuda.graph_pool_handle()
            self._captured_for = cache.keys.data_ptr()
        key = shape + (window,)
        if key not in self._graphs:
            self._graphs[key] = self._capture(shape, window)
        graph, outputs = self._graphs[key]
        graph.replay()
        return tuple(out.clone() for out in outputs)

    def _step(self, shape: tuple, window: int, root: torch.Tensor, length: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if shape[0] == "chain":
            return (draft_chain(self.head, self.cache, root, length, shape[1], window),)
        return draft_tree(self.head, self.cache, root, length, *shape[1:], window)

    def _capture(self, shape: tuple, window: int):
        return captured(lambda: self._step(shape, window, self.root, self.length), self._memory_pool)


def captured(run, memory_pool) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """(graph, the outputs each replay writes) of run(), a shape-static step over static inputs: warmed up on a
    side stream, then captured into `memory_pool`."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(WARMUP_CALLS):
            run()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=memory_pool):
        outputs = run()
    return graph, outputs
