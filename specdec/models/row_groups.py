"""How the torch forward (llama.py) splits a batch pass by its rows: groups that fit the cache, groups whose
padding stays small, and attention row by row over scattered slots."""
from __future__ import annotations

import torch

from .layer_ops import attend


def fitting_groups(starts: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows in groups whose padded pass (the latest start plus the longest row) fits `capacity` cache rows; rows
    sorted by start, so that a row that fits alone always fits its group. One group when all fit together."""
    if max(starts) + max(lengths) <= capacity:
        return [list(range(len(starts)))]
    groups, current = [], []
    for i in sorted(range(len(starts)), key=lambda i: starts[i]):
        if current and max(starts[j] for j in current + [i]) + max(lengths[j] for j in current + [i]) > capacity:
            groups.append(current)
            current = []
        current.append(i)
    return groups + [current]


def attention_by_row(q, keys, values, slots: list[int], starts: list[int], masks: list, scale: float,
                      softcap: float | None) -> torch.Tensor:
    """Attention (B, nh, T, hd) of each row of q (B, nh, T, hd) over its own slot's cached keys and values (S, nkv,
    P, hd), read in place up to that row's end. Gathering scattered slots into one tensor would copy every row's
    cache up to the longest row's end, in each layer (for 32 rows of 1k tokens in float32, 1.5 GB a step: half the
    soak's decode time); each row's small pass here reads views and equals its pass alone."""
    T = q.shape[2]
    return torch.cat([attend(q[b:b + 1], keys[slot:slot + 1, :, :start + T], values[slot:slot + 1, :, :start + T],
                             mask, scale, softcap)
                      for b, (slot, start, mask) in enumerate(zip(slots, starts, masks))])


PAD_WASTE_TOKENS = 32  # about what one more pass costs on a CPU (its weights read again), in token rows


def padding_groups(lengths: list[int], waste: int = PAD_WASTE_TOKENS) -> list[list[int]]:
    """Rows in groups, by length, such that padding each group to its longest row adds at most `waste` token rows
    per row that joins it: a batch pass over prompts of unequal lengths computes every row at the longest length,
    and its attention takes the masked path (measured on a 2-core CPU, smollm2-135m: prompts of 100, 100 and 780
    tokens took 20.6 s together and 6.8 s in passes apart). Verify passes (1 + k tokens a row) stay one group.
    Example: lengths [780, 100, 9, 100] -> [[2], [1, 3], [0]]."""
    groups, current, longest = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and len(current) * (lengths[i] - longest) > waste:
            groups.append(current)
            current = []
        current.append(i)
        longest = lengths[i]
    return groups + [current]
