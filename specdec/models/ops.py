"""The operations of specdec's torch forward (llama.py) and its shape-static pass (static_pass.py).

- Matrix products: oneDNN-packed weights on the CPU, plain F.linear elsewhere. Packing reorders a weight once into
  the blocked layout the CPU kernel reads, instead of on every call; on a 2-core AVX-512 machine it cut bfloat16
  matmul time by about a third, with results bit-identical to F.linear in bfloat16.
- The per-layer arithmetic, one small function per step, each in transformers' order of operations and dtype
  casts: RMSNorm (Llama's and Gemma's), RoPE, the MLP's gated activation, soft-capping and attention.
- Attention masks of the eager pass, and how a batch pass groups its rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class Linear:
    """y = x @ W.T (+ b). weight: (N, K); x: (..., K) -> (..., N)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True):
        self.weight = weight
        self.bias = bias
        self.out_features = weight.shape[0]
        self.packed = _pack(weight) if pack else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None:
            return F.linear(x, self.weight, self.bias)
        flat = x.reshape(-1, x.shape[-1])
        y = torch.ops.mkldnn._linear_pointwise(flat, self.packed, self.bias, "none", [], "")
        return y.view(*x.shape[:-1], self.out_features)


def _pack(weight: torch.Tensor) -> torch.Tensor | None:
    """Returns the oneDNN-packed weight, or None where packing is unavailable or not exact."""
    if weight.device.type != "cpu" or weight.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight, 1)
        probe = torch.randn(3, weight.shape[1], dtype=weight.dtype)
        got = torch.ops.mkldnn._linear_pointwise(probe, packed, None, "none", [], "")
        if not torch.equal(got, F.linear(probe, weight)):
            return None
        return packed
    except (RuntimeError, AttributeError):
        return None


class FusedLinear:
    """Several projections of the same input: (..., K) -> tuple of (..., N_i).

    Fused into one matmul when `fuse`; kept apart otherwise (in float32, one wide product rounds
    differently from separate ones, and separate ones reproduce transformers bit for bit).
    """

    def __init__(
        self,
        weights: list[torch.Tensor],
        biases: list[torch.Tensor | None],
        fuse: bool,
        pack: bool = True,
        sizes: list[int] | None = None,
    ):
        """sizes: the outputs' widths, where one weight holds several (Phi-3's qkv_proj); default: each weight's."""
        self.sizes = sizes or [w.shape[0] for w in weights]
        if fuse:
            bias = None if any(b is None for b in biases) else torch.cat([b for b in biases if b is not None])
            self.parts = [Linear(torch.cat(weights).contiguous(), bias, pack)]
        else:
            self.parts = [Linear(w, b, pack) for w, b in zip(weights, biases)]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if len(self.parts) == 1:
            return self.parts[0](x).split(self.sizes, dim=-1)
        return tuple(part(x) for part in self.parts)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, cast back, then scaled: exactly transformers' LlamaRMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def gemma_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: scaled by weight (1 + w, float32) in float32, then cast, as transformers' Gemma2RMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return (h * weight).to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., hd) with RoPE on its first cos.shape[-1] dims (all, unless the config rotates part of each head), as
    transformers computes it; cos, sin broadcast to (..., rotated dims)."""
    rotated = cos.shape[-1]
    if rotated == x.shape[-1]:
        return x * cos + rotate_half(x) * sin
    turned, kept = x[..., :rotated], x[..., rotated:]
    return torch.cat([turned * cos + rotate_half(turned) * sin, kept], dim=-1)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def gated(gate: torch.Tensor, up: torch.Tensor, gelu: bool) -> torch.Tensor:
    """The MLP's gated activation: SwiGLU, or GeGLU with tanh-approximated GELU (Gemma)."""
    return (F.gelu(gate, approximate="tanh") if gelu else F.silu(gate)) * up


def soft_cap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's scores and logits), in transformers' order; x itself where cap is None."""
    return x if cap is None else torch.tanh(x / cap) * cap


def attend(q, keys, values, mask, scale: float, softcap: float | None) -> torch.Tensor:
    """Attention (B, nh, T, hd) of q (B, nh, T, hd) over keys and values (B, nkv, S, hd), the last T keys being q's
    own tokens; mask (B, 1, T, S) bool, or None for causal order. With soft-capped scores (Gemma 2) as transformers'
    eager attention computes it, else by SDPA."""
    gqa = keys.shape[1] != q.shape[1]
    T, S = q.shape[2], keys.shape[2]
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=scale, is_causal=mask is None and T > 1, enable_gqa=gqa
        )
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = soft_cap(torch.matmul(q, keys.transpose(2, 3)) * scale, softcap)
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)


def attention_mask(
    starts: list[int], T: int, end: int, tree_mask: torch.Tensor | None, positions: torch.Tensor, window: int = 0
):
    """(B, 1, T, end) bool: query t of row b sees cached keys < starts[b] and its new ancestors; with a window,
    only those whose position is less than `window` before its own (positions: (B, T), the queries').

    None where plain causal attention over all keys is exact (one row, prefill or one token).
    """
    B = len(starts)
    if window and end > window:
        visible = attention_mask(starts, T, end, tree_mask, positions)
        if visible is None:
            visible = causal_mask(starts, T, end, positions.device)
        key_positions = torch.arange(end, device=positions.device).repeat(B, 1)  # (B, end)
        for b, s in enumerate(starts):
            key_positions[b, s : s + T] = positions[b]
        return visible & (positions[:, :, None] - key_positions[:, None, :] < window).unsqueeze(1)
    if B == 1 and tree_mask is None and (T == 1 or starts[0] == 0):
        return None
    device = positions.device
    if tree_mask is not None:
        if B != 1:
            raise ValueError("tree attention takes one sequence at a time")
        visible = torch.zeros(T, end, dtype=torch.bool, device=device)
        visible[:, : starts[0]] = True
        visible[:, starts[0] : starts[0] + T] = tree_mask
        return visible[None, None]
    return causal_mask(starts, T, end, device)


def causal_mask(starts: list[int], T: int, end: int, device: torch.device) -> torch.Tensor:
    """(B, 1, T, end) bool: query t of row b sees the keys before starts[b] + t + 1."""
    key = torch.arange(end, device=device)[None, None, :]  # (1, 1, end)
    start = torch.tensor(starts, device=device)[:, None, None]  # (B, 1, 1)
    query = torch.arange(T, device=device)[None, :, None]  # (1, T, 1)
    rel = key - start  # (B, 1, end): key offset among this row's new tokens
    return (rel <= query).unsqueeze(1)  # (B, 1, T, end): cached keys have rel < 0


def fitting_groups(starts: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
    """Rows in groups whose padded pass (the latest start plus the longest row) fits `capacity` cache rows; rows
    sorted by start, so that a row that fits alone always fits its group. One group when all fit together."""
    if max(starts) + max(lengths) <= capacity:
        return [list(range(len(starts)))]
    groups: list[list[int]] = []
    current: list[int] = []
    for i in sorted(range(len(starts)), key=lambda i: starts[i]):
        if current and max(starts[j] for j in current + [i]) + max(lengths[j] for j in current + [i]) > capacity:
            groups.append(current)
            current = []
        current.append(i)
    return groups + [current]


def attention_by_row(
    q, keys, values, slots: list[int], starts: list[int], masks: list, scale: float, softcap: float | None
) -> torch.Tensor:
    """Attention (B, nh, T, hd) of each row of q (B, nh, T, hd) over its own slot's cached keys and values (S, nkv,
    P, hd), read in place up to that row's end. Gathering scattered slots into one tensor would copy every row's
    cache up to the longest row's end, in each layer (for 32 rows of 1k tokens in float32, 1.5 GB a step: half the
    soak's decode time); each row's small pass here reads views and equals its pass alone."""
    T = q.shape[2]
    return torch.cat(
        [
            attend(
                q[b : b + 1],
                keys[slot : slot + 1, :, : start + T],
                values[slot : slot + 1, :, : start + T],
                mask,
                scale,
                softcap,
            )
            for b, (slot, start, mask) in enumerate(zip(slots, starts, masks))
        ]
    )


PAD_WASTE_TOKENS = 32  # about what one more pass costs on a CPU (its weights read again), in token rows


def padding_groups(lengths: list[int], waste: int = PAD_WASTE_TOKENS) -> list[list[int]]:
    """Rows in groups, by length, such that padding each group to its longest row adds at most `waste` token rows
    per row that joins it: a batch pass over prompts of unequal lengths computes every row at the longest length,
    and its attention takes the masked path (measured on a 2-core CPU, smollm2-135m: prompts of 100, 100 and 780
    tokens took 20.6 s together and 6.8 s in passes apart). Verify passes (1 + k tokens a row) stay one group.
    Example: lengths [780, 100, 9, 100] -> [[2], [1, 3], [0]]."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        if current and len(current) * (lengths[i] - longest) > waste:
            groups.append(current)
            current = []
        current.append(i)
        longest = lengths[i]
    return groups + [current]
