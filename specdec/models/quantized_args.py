"""CpuLlama's arguments with a GGUF file's quantized matrices packed for the kernels.

kernel_model_args leaves a quantized matrix as a list of parts (gguf_blocks.QuantizedRows; several where the
kernels fuse matrices that the file stores apiece, as q, k and v, possibly in different formats). Here each becomes
one uint8 tensor of packed bytes and its description for the kernels (format, rows, inner size, bytes per part),
the argument CpuLlama takes last; a float part among quantized ones (a type the kernels do not read, dequantized)
goes as float32 bytes, format 0. A matrix that is a tensor stays as it is, described by an empty list.
"""

from __future__ import annotations

import numpy as np
import torch

from .gguf_blocks import K6, GGUFMatrix, QuantizedRows

EMPTY = np.zeros(0, dtype=np.uint8)


def pack_rows(module, rows: QuantizedRows | GGUFMatrix) -> torch.Tensor:
    """One quantized matrix packed by the kernels (pack_codes): uint8 bytes."""
    if isinstance(rows, GGUFMatrix):
        rows = rows.rows()
    first, second = rows.first, rows.second
    if rows.fmt == K6:  # one sc per 16 weights: the first and second halves of each group of 32
        first, second = rows.first[:, 0::2], rows.first[:, 1::2]

    def tensor(a):
        return torch.from_numpy(np.ascontiguousarray(EMPTY if a is None else a))

    return module.pack_codes(
        rows.fmt, tensor(rows.codes), tensor(first), tensor(second), tensor(rows.super_d), tensor(rows.super_m)
    )


def float_bytes(weight: torch.Tensor) -> torch.Tensor:
    """A float matrix's float32 values as bytes, a part of format 0."""
    return weight.float().contiguous().view(torch.uint8).reshape(-1)


def packed_arguments(module, args: list) -> tuple[list, list[list[int]]]:
    """(args with every quantized matrix as packed bytes, the packing descriptions: 12 a layer, then the embeddings'
    and the LM head's) for kernel_model_args' list; a tied head reuses the embeddings' bytes."""
    tensors, embed, lm_head = args[2], args[3], args[5]
    done: dict[int, tuple[torch.Tensor, list[int]]] = {}

    def pack(value):
        if isinstance(value, torch.Tensor):
            return value, []
        if id(value) not in done:
            parts = [float_bytes(rows) if isinstance(rows, torch.Tensor) else pack_rows(module, rows) for rows in value]
            packing = []
            for rows, packed in zip(value, parts):
                fmt = 0 if isinstance(rows, torch.Tensor) else rows.fmt
                packing += [fmt, rows.shape[0], rows.shape[1], packed.numel()]
            done[id(value)] = (torch.cat(parts) if len(parts) > 1 else parts[0], packing)
        return done[id(value)]

    packed = [pack(t) for t in (*tensors, embed, lm_head)]
    new_args = list(args)
    new_args[2] = [p[0] for p in packed[:-2]]
    new_args[3], new_args[5] = packed[-2][0], packed[-1][0]
    return new_args, [p[1] for p in packed]


def quantized_kinds(args: list) -> list[str]:
    """The GGUF types of the quantized matrices in kernel_model_args' list (none: a float model)."""
    return sorted(
        {
            rows.kind
            for t in (*args[2], args[3], args[5])
            if isinstance(t, list)
            for rows in t
            if not isinstance(rows, torch.Tensor)
        }
    )
