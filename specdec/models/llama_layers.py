"""The per-layer weights of FastLlama (llama.py), gathered from a transformers Llama-family state dict: fused QKV and
gate/up projections, packed for the CPU where the model runs there, and the family's norms, window and RoPE table
(family.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .family import Family, gate_up_names, norm_names, norm_weight, qkv_names
from .ops import FusedLinear, Linear


@dataclass
class LlamaLayer:
    input_norm: torch.Tensor  # (H,)
    qkv: FusedLinear  # H -> (nh * hd, nkv * hd, nkv * hd)
    o: Linear  # nh * hd -> H
    post_norm: torch.Tensor  # (H,)
    gate_up: FusedLinear  # H -> (I, I)
    down: Linear  # I -> H
    q_norm: torch.Tensor | None = None  # (hd,): Qwen3's and Gemma 3's RMSNorm of each query head, before RoPE
    k_norm: torch.Tensor | None = None  # (hd,): the same for each key head
    attn_out_norm: torch.Tensor | None = None  # (H,): Gemma's norm of the attention's output
    mlp_out_norm: torch.Tensor | None = None  # (H,): Gemma's norm of the MLP's output
    window: int = 0  # positions a query sees back (0: all), family.window(layer)
    rope_kind: str | None = None  # its RoPE table, family.rope_kind(layer)


def llama_layers(
    sd: dict, cfg, family: Family, heads: tuple[int, int, int], fuse: bool, pack: bool
) -> list[LlamaLayer]:
    """Every decoder layer's weights from the state dict `sd` of a model with config `cfg`; heads: (query heads,
    key-value heads, head dim); fuse: the fused projections as one matrix (else their parts side by side); pack:
    weights packed for the CPU's products (ops.Linear)."""
    nh, nkv, hd = heads

    def proj(names: list[str], sizes: list[int]) -> FusedLinear:
        return FusedLinear([sd[n + ".weight"] for n in names], [sd.get(n + ".bias") for n in names], fuse, pack, sizes)

    def norm(name: str) -> torch.Tensor:
        return norm_weight(sd[name + ".weight"], family)

    def optional_norm(name: str | None) -> torch.Tensor | None:
        return None if name is None else norm(name)

    layers = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        norms = norm_names(p, family)
        qk_norm = family.qk_norm
        layers.append(
            LlamaLayer(
                input_norm=norm(norms["input"]),
                qkv=proj(qkv_names(p, family), [nh * hd, nkv * hd, nkv * hd]),
                o=Linear(sd[p + "self_attn.o_proj.weight"], sd.get(p + "self_attn.o_proj.bias"), pack),
                post_norm=norm(norms["mlp_in"]),
                gate_up=proj(gate_up_names(p, family), [cfg.intermediate_size] * 2),
                down=Linear(sd[p + "mlp.down_proj.weight"], None, pack),
                q_norm=optional_norm(p + "self_attn.q_norm" if qk_norm else None),
                k_norm=optional_norm(p + "self_attn.k_norm" if qk_norm else None),
                attn_out_norm=optional_norm(norms.get("attn_out")),
                mlp_out_norm=optional_norm(norms.get("mlp_out")),
                window=family.window(i),
                rope_kind=family.rope_kind(i),
            )
        )
    return layers
