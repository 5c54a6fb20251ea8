"""The per-layer arithmetic of specdec's torch forward (llama.py), one small function per step, each in
transformers' order of operations and dtype casts: RMSNorm (Llama's and Gemma's), RoPE, the MLP's gated activation,
soft-capping and attention."""
from __future__ import annotations

import torch
import torch.nn.functional as F


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
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                              is_causal=mask is None and T > 1, enable_gqa=gqa)
    groups = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    scores = soft_cap(torch.matmul(q, keys.transpose(2, 3)) * scale, softcap)
    if mask is None:
        mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    weights = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(weights, values)
