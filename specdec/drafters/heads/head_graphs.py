"""An EAGLE head's drafting steps (eagle_device.py) over buckets of shapes, captured as CUDA graphs on a GPU.

A bucket is one step's shape: a chain of k tokens, a tree of depth x width candidates keeping `nodes`, or the feed
of up to FEED_BUCKETS[i] true pairs, and the key window the head attends over (as models/pass_graphs.py: the
smallest power of two from MIN_WINDOW that holds the true pairs and the drafted ones, or the whole buffer).
Every bucket reads the same static inputs, the root hidden state (H,), the cache length (), and the feed's pairs
(features, tokens, count), and writes its own outputs. A feed and the drafting step after it replay back to back: the feed's output is the step's root, copied on
the device, and the cache length is filled by a kernel, so nothing waits for the host between them.

With capture on (CUDA), a bucket's step is warmed up on a side stream with the live inputs (its writes land past
the true pairs, in rows the step itself overwrites), captured once with torch.cuda.graph (all buckets share one
memory pool) and replayed; its outputs are cloned, since a later replay may overwrite them. With capture off (the
CPU) the same code runs directly. Graphs read the cache's buffer as it was at capture: when it grows, they are
captured again at their next use.
"""

from __future__ import annotations

from typing import Any

import torch

from ...models.pass_graphs import MIN_WINDOW, captured, key_windows, smallest_fitting
from .eagle_device import HeadCache, draft_chain, draft_tree, feed_pairs

FEED_BUCKETS = (1, 2, 4, 8, 16)  # true pairs fed per step; more (the prompt) are fed eagerly by the caller


class HeadGraphs:
    """Runs a head's greedy chains and trees as shape-static steps over `cache`, captured where `capture`."""

    def __init__(self, head, cache: HeadCache, capture: bool, min_window: int = MIN_WINDOW):
        device = cache.keys.device
        if capture and device.type != "cuda":
            raise ValueError("CUDA graphs are captured on a CUDA device only")
        self.head, self.cache, self.capture, self.min_window = head, cache, capture, min_window
        self.root = torch.zeros(head.config.hidden_size, device=device, dtype=cache.keys.dtype)  # static input
        self.length = torch.zeros((), dtype=torch.long, device=device)  # static input
        # the feed's static inputs; padding rows keep earlier pairs' values (finite, and seen by no real pair)
        self.feed_hidden = torch.zeros(FEED_BUCKETS[-1], head.config.hidden_size, device=device, dtype=cache.keys.dtype)
        self.feed_tokens = torch.zeros(FEED_BUCKETS[-1], dtype=torch.long, device=device)
        self.feed_count = torch.zeros((), dtype=torch.long, device=device)
        self._graphs: dict[tuple, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._captured_for: int | None = None  # the cache buffer the graphs read
        self._memory_pool: Any = None  # torch.cuda's graph pool handle, once a graph is captured

    @torch.inference_mode()  # the cache and the static inputs are written in this mode only
    def chain(self, root: torch.Tensor, k: int) -> torch.Tensor:
        """The greedy chain of k token ids (k,) after root (H,), the head's output at the cache's last true pair."""
        self.root.copy_(root)
        return self._run(("chain", k), k - 1)[0]

    @torch.inference_mode()  # the cache and the static inputs are written in this mode only
    def tree(self, root: torch.Tensor, depth: int, width: int, nodes: int):
        """(token ids (N,), parents (N,), scores (N,)) of the most probable N = min(nodes, depth x width) nodes of a
        depth x width tree after root (H,) (eagle_device.draft_tree)."""
        self.root.copy_(root)
        return self._run(("tree", depth, width, min(nodes, depth * width)), depth * width)

    @torch.inference_mode()
    def feed(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Feeds n <= FEED_BUCKETS[-1] true pairs (hidden (n, H) features, tokens (n,) token ids on the device) after
        the cache's true pairs, padded to the smallest bucket that holds them; returns the head's output at the
        last one (H,), the next step's root."""
        n = tokens.shape[0]
        bucket = smallest_fitting(FEED_BUCKETS, n)
        if not n or bucket is None:
            raise ValueError(f"a bucketed feed takes 1 to {FEED_BUCKETS[-1]} pairs, not {n}")
        self.feed_hidden[:n].copy_(hidden)
        self.feed_tokens[:n].copy_(tokens)
        self.feed_count.fill_(n)
        out = self._run(("feed", bucket), bucket)[0]
        self.cache.length += n
        return out

    # ---- internals ------------------------------------------------------------------------------------------
    @torch.inference_mode()  # the cache is written in this mode only (EagleDrafter's observe and propose too)
    def _run(self, shape: tuple, drafted_rows: int) -> tuple[torch.Tensor, ...]:
        cache = self.cache
        cache.reserve(cache.length + drafted_rows + 1)
        window = smallest_fitting(key_windows(cache.capacity, self.min_window), cache.length + drafted_rows)
        assert window is not None  # the cache was just reserved to hold them: its capacity is the largest window
        self.length.fill_(cache.length)  # a kernel on CUDA, not a copy that would wait
        if not self.capture:
            return self._step(shape, window)
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

    def _step(self, shape: tuple, window: int) -> tuple[torch.Tensor, ...]:
        """One bucket's step over the static inputs."""
        if shape[0] == "feed":
            bucket = shape[1]
            return (
                feed_pairs(
                    self.head,
                    self.cache,
                    self.feed_hidden[:bucket],
                    self.feed_tokens[:bucket],
                    self.feed_count,
                    self.length,
                    window,
                ),
            )
        if shape[0] == "chain":
            return (draft_chain(self.head, self.cache, self.root, self.length, shape[1], window),)
        _, depth, width, nodes = shape
        return draft_tree(self.head, self.cache, self.root, self.length, depth, width, nodes, window)

    def _capture(self, shape: tuple, window: int):
        return captured(lambda: self._step(shape, window), self._memory_pool)
