"""A bucket's inputs built on the host each step, in place, and sent to the device in two copies.

With CUDA graphs the GPU's part of a step is one replay, and the host must stay ahead of it: building the padded
inputs as a dozen small tensors, then copying each of the six into the graph's static inputs, cost about 30 torch
operations a step (docs/experiments/gpu_host_overhead.md). Here the six inputs are views of two preallocated
buffers (int64: ids, positions, write rows, slots, lengths; bool: the tree), written with numpy in place and copied
without waiting; on CUDA the host buffers are pinned, so the copies are asynchronous, and the host waits for the last
step's copies (an event) before it writes the buffers again. The values are padded_inputs' (pass_graphs.py), which
stays their definition (tests/test_static_pass.py checks both give the same inputs).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .backend import SequenceCache
from .static_pass import StaticInputs


def packed_inputs(longs, flags, batch: int, tokens: int) -> StaticInputs:
    """StaticInputs whose fields are views of longs (3 * B * T + 2 * B,) int64 and flags (B * T * T,) bool: tensors,
    or numpy arrays of the same memory."""
    bt = batch * tokens
    return StaticInputs(
        ids=longs[:bt].reshape(batch, tokens),
        positions=longs[bt : 2 * bt].reshape(batch, tokens),
        write_rows=longs[2 * bt : 3 * bt].reshape(batch, tokens),
        slots=longs[3 * bt : 3 * bt + batch],
        lengths=longs[3 * bt + batch :],
        tree=flags.reshape(batch, tokens, tokens),
    )


class HostInputs:
    """One bucket's (B, T) inputs: `device` (what the pass or its graph reads, on the model's device) and the host
    buffers fill() writes them from."""

    def __init__(self, batch: int, tokens: int, scratch_row: int, device: torch.device):
        self.shape = (batch, tokens)
        self.scratch_row = scratch_row
        on_gpu = device.type == "cuda"
        longs = torch.zeros(3 * batch * tokens + 2 * batch, dtype=torch.long, pin_memory=on_gpu)
        flags = torch.zeros(batch * tokens * tokens, dtype=torch.bool, pin_memory=on_gpu)
        self._host = (longs, flags)
        # the same memory, as numpy arrays (a StaticInputs of arrays: its fields are typed for tensors)
        self._numpy: Any = packed_inputs(longs.numpy(), flags.numpy(), batch, tokens)
        if device.type == "cpu":  # the pass reads the host buffers themselves
            self._device = None
            self.device = packed_inputs(longs, flags, batch, tokens)
        else:
            self._device = (torch.zeros_like(longs, device=device), torch.zeros_like(flags, device=device))
            self.device = packed_inputs(*self._device, batch, tokens)
        self._copied = torch.cuda.Event() if on_gpu else None
        self._lower = np.tril(np.ones((tokens, tokens), dtype=bool))  # a chain's tree
        self._offsets = np.arange(tokens)

    def fill(self, caches: list[SequenceCache], input_ids: list[torch.Tensor], tree_mask: torch.Tensor | None) -> None:
        """Writes the inputs of rows input_ids[b] (n_b,) appended to caches[b] (tree_mask (n, n) bool: one row's
        tree) into the device inputs, as padded_inputs defines them."""
        if self._copied is not None:
            self._copied.synchronize()  # the last step's copies have read the host buffers
        host = self._numpy
        host.ids.fill(0)
        host.positions.fill(0)
        host.write_rows.fill(self.scratch_row)
        host.slots.fill(0)
        host.lengths.fill(0)
        host.tree.fill(False)
        tree = None if tree_mask is None else tree_mask.cpu().numpy()
        for b, (cache, ids) in enumerate(zip(caches, input_ids)):
            n, length = int(ids.numel()), cache.length
            host.ids[b, :n] = ids.view(-1).tolist()  # no tensor made (on a GPU, a read-back as .cpu() would be)
            host.slots[b] = cache.slot
            host.lengths[b] = length
            host.write_rows[b, :n] = length + self._offsets[:n]
            if tree is not None:
                host.tree[b, :n, :n] = tree
                host.positions[b, :n] = length + tree.sum(-1) - 1  # each node's depth (backend.tree_positions)
            else:
                host.tree[b, :n, :n] = self._lower[:n, :n]
                host.positions[b, :n] = host.write_rows[b, :n]
        if self._device is not None and self._copied is not None:  # on a GPU, both
            for device, host_buffer in zip(self._device, self._host):
                device.copy_(host_buffer, non_blocking=True)
            self._copied.record()
