"""FastLlama's decode and verify passes over buckets of shapes, captured as CUDA graphs on a GPU.

A pass of R rows x N new tokens runs in the smallest bucket (B, T) with B >= R and T >= N, of BATCH_SIZES x
TOKEN_COUNTS: its inputs are padded (padding tokens write the scratch row of a slot, static_pass.py) on the host, in
place in two buffers, and copied into the bucket's static tensors in two copies (host_inputs.py; padded_inputs below
is their definition), and its outputs are sliced back. Attention reads a key window of W rows of each row's
slot, the smallest power of two from MIN_WINDOW that holds every row's keys (or the whole pool): a pass at a short
context does not gather and attend over the whole pool. A pass that fits no bucket (a long prompt, a batch over
the largest size, an early exit) returns None, and FastLlama runs its eager forward instead.

With capture on (CUDA), each bucket's pass is warmed up on a side stream, captured once with torch.cuda.graph (all
buckets share one memory pool; at load, every (B, T) with the smallest window, the largest first; other windows at
their first use) and replayed; the live rows of its outputs are copied at once (the hidden states only where asked
for), since a later replay of any graph in the pool may overwrite them. With compile on, the pass's steps are
compiled by torch.compile (compiled_pass.py) in the warm-up before capture. With capture off (the CPU, or --graphs on a CPU) the same code calls static_pass directly: that is
how the CPU tests cover the graph path. Graphs read the pool's tensors and the target's feature layers as
they were at capture; when the pool grows (more slots) or a drafter asks for more feature layers, they are captured
again at their next use.
"""

from __future__ import annotations

import bisect
from typing import Any

import torch

from .backend import SequenceCache, tree_positions
from .host_inputs import HostInputs
from .static_pass import PLAIN_STEPS, StaticInputs, static_pass

BATCH_SIZES = (1, 2, 4, 8, 16)
TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)
MIN_WINDOW = 256
WARMUP_CALLS = 3


def smallest_fitting(sizes: tuple[int, ...], n: int) -> int | None:
    """The smallest of sorted `sizes` that is >= n, or None when n exceeds them all."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


def key_windows(capacity: int, smallest: int = MIN_WINDOW) -> tuple[int, ...]:
    """Key windows of a pool of `capacity` rows: powers of two from `smallest` below it, then the whole pool."""
    windows = []
    while smallest < capacity:
        windows.append(smallest)
        smallest *= 2
    return tuple(windows) + (capacity,)


class _Bucket:
    """One pass shape (B, T): its static inputs (written from the host, host_inputs.py) and, per (key window,
    feature layers) once captured, its graph and the outputs the graph writes on each replay: (logits (B, T, V),
    hidden (B, T, H + A*H))."""

    def __init__(self, batch: int, tokens: int, scratch_row: int, device: torch.device):
        self.shape = (batch, tokens)
        self.host = HostInputs(batch, tokens, scratch_row, device)
        self.inputs = self.host.device
        # (key window, feature layers) -> (graph, its outputs)
        self.graphs: dict[tuple[int, tuple[int, ...]], tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}


class PassGraphs:
    """Runs FastLlama passes of up to max(batch_sizes) rows x max(token_counts) tokens as shape-static passes."""

    def __init__(
        self,
        model,
        capture: bool,
        batch_sizes: tuple[int, ...] = BATCH_SIZES,
        token_counts: tuple[int, ...] = TOKEN_COUNTS,
        min_window: int = MIN_WINDOW,
        compile: bool = False,
    ):
        """compile: the pass's steps compiled by torch.compile (compiled_pass.py) before capture."""
        if capture and model.info.device.type != "cuda":
            raise ValueError("CUDA graphs are captured on a CUDA device only")
        self.model = model
        self.capture = capture
        self.compiled = compile
        if compile:
            from .compiled_pass import compiled_steps

            self.steps = compiled_steps()
        else:
            self.steps = PLAIN_STEPS
        self.batch_sizes = tuple(sorted(batch_sizes))
        self.token_counts = tuple(sorted(token_counts))
        self.windows = key_windows(model.pool.capacity, min_window)
        self._buckets: dict[tuple[int, int], _Bucket] = {}
        self._captured_for: int | None = None  # the pool tensor that the captured graphs read
        self._memory_pool: Any = None  # torch.cuda's graph pool handle, once a graph is captured

    def bucket_shape(self, rows: int, tokens: int) -> tuple[int, int] | None:
        """The smallest bucket (B, T) that holds `rows` rows of `tokens` new tokens, or None."""
        batch, count = smallest_fitting(self.batch_sizes, rows), smallest_fitting(self.token_counts, tokens)
        return None if batch is None or count is None else (batch, count)

    def run(
        self,
        caches: list[SequenceCache],
        input_ids: list[torch.Tensor],
        tree_mask: torch.Tensor | None = None,
        output_hidden: bool = True,
        feature_layers: tuple[int, ...] = (),
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]] | None:
        """Scores input_ids[b] (n_b,) appended to caches[b] (tree_mask (n, n) bool: one row's tree); advances the
        caches' lengths. Returns each row's (logits (n_b, V), hidden (n_b, H + A*H): the final state, then the inputs
        of the A feature_layers; None unless output_hidden), or None (nothing run) when the pass fits no bucket or
        would run past the cache's end (the eager forward then runs, and raises)."""
        counts = [int(ids.numel()) for ids in input_ids]
        shape = self.bucket_shape(len(caches), max(counts))
        if (
            shape is None
            or min(counts) == 0
            or any(c.length + n > self.model.max_context for c, n in zip(caches, counts))
        ):
            return None
        bucket = self._bucket(shape)
        bucket.host.fill(caches, input_ids, tree_mask)
        window = smallest_fitting(self.windows, max(c.length + n for c, n in zip(caches, counts)))
        assert window is not None  # the whole pool is the largest window, and every row fits it (above)
        logits, states = self._execute(bucket, window, tuple(feature_layers))
        hidden: torch.Tensor | None = states
        for cache, n in zip(caches, counts):
            cache.length += n
        if not output_hidden:
            hidden = None
        if self.capture:  # the next replay writes the same tensors: what is returned is copied (one copy each)
            logits = logits[: len(counts), : max(counts)].clone()
            hidden = None if hidden is None else hidden[: len(counts), : max(counts)].clone()
        return [(logits[b, :n], None if hidden is None else hidden[b, :n]) for b, n in enumerate(counts)]

    def prepare(self) -> None:
        """Captures every bucket's graph over the smallest key window now, the largest bucket first (they share one
        memory pool); no-op uncaptured."""
        if not self.capture:
            return
        self._check_captured_state()
        for shape in sorted(
            ((b, t) for b in self.batch_sizes for t in self.token_counts), key=lambda s: s[0] * s[1], reverse=True
        ):
            self._capture(self._bucket(shape), self.windows[0], ())

    # ---- internals ------------------------------------------------------------------------------------------
    def _bucket(self, shape: tuple[int, int]) -> _Bucket:
        if shape not in self._buckets:
            self._buckets[shape] = _Bucket(*shape, self.model.pool.capacity - 1, self.model.info.device)
        return self._buckets[shape]

    def _execute(
        self, bucket: _Bucket, window: int, feature_layers: tuple[int, ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.capture:
            return static_pass(self.model, bucket.inputs, window, feature_layers, self.steps)
        self._check_captured_state()
        if (window, feature_layers) not in bucket.graphs:
            live = StaticInputs.empty(*bucket.shape, self.model.info.device)
            live.copy_(bucket.inputs)  # capture runs the pass on padding inputs, which write scratch rows only
            self._capture(bucket, window, feature_layers)
            bucket.inputs.copy_(live)
        graph, outputs = bucket.graphs[window, feature_layers]
        graph.replay()
        logits, hidden = outputs  # what static_pass returns
        return logits, hidden

    def _check_captured_state(self) -> None:
        """Drops every graph when the pool's tensors differ from those captured."""
        state = self.model.pool.keys.data_ptr()
        if state != self._captured_for:
            for bucket in self._buckets.values():
                bucket.graphs.clear()
            self._memory_pool = torch.cuda.graph_pool_handle()
            self._captured_for = state

    def _capture(self, bucket: _Bucket, window: int, feature_layers: tuple[int, ...]) -> None:
        """Warms the bucket's pass over `window` key rows (returning the inputs of `feature_layers`) up on a side
        stream, then captures it into the shared memory pool."""
        if (window, feature_layers) in bucket.graphs:
            return
        bucket.inputs.copy_(_padding_inputs(*bucket.shape, self.model.pool.capacity - 1))
        bucket.graphs[window, feature_layers] = captured(
            lambda: static_pass(self.model, bucket.inputs, window, feature_layers, self.steps), self._memory_pool
        )


def padded_inputs(
    shape: tuple[int, int],
    caches: list[SequenceCache],
    input_ids: list[torch.Tensor],
    tree_mask: torch.Tensor | None,
    scratch_row: int,
) -> StaticInputs:
    """Host inputs (CPU) of a bucket of `shape` (B, T) for rows input_ids[b] (n_b,) appended to caches[b]: row b's
    live tokens write rows length_b.. of its slot (a tree_mask (n, n) bool: one row's tree, positions by depth);
    every other token is padding."""
    host = _padding_inputs(*shape, scratch_row)
    for b, (cache, ids) in enumerate(zip(caches, input_ids)):
        n = int(ids.numel())
        host.ids[b, :n] = ids.view(-1).cpu()
        host.slots[b] = cache.slot
        host.lengths[b] = cache.length
        host.write_rows[b, :n] = cache.length + torch.arange(n)
        if tree_mask is not None:
            host.tree[b, :n, :n] = tree_mask.cpu()
            host.positions[b, :n] = cache.length + tree_positions(host.tree[b, :n, :n])
        else:
            host.tree[b, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril_()
            host.positions[b, :n] = host.write_rows[b, :n]
    return host


def _padding_inputs(batch: int, tokens: int, scratch_row: int) -> StaticInputs:
    """Host inputs (CPU) in which every token is padding: it writes slot 0's scratch row and sees key row 0."""
    inputs = StaticInputs.empty(batch, tokens, torch.device("cpu"))
    inputs.write_rows.fill_(scratch_row)
    return inputs


def captured(run, memory_pool) -> tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]:
    """(graph, the outputs each replay writes) of run(), a shape-static step over static inputs: warmed up on a
    side stream (WARMUP_CALLS calls), then captured into `memory_pool`."""
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
