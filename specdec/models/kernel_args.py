"""What specdec's CPU kernels take of a transformers model of a family the fast paths run (family.py): whether its
shape suits them (kernel_shape_problem, four_bit_problem) and CpuLlama's arguments (kernel_model_args)."""

from __future__ import annotations

import torch

from .family import family_of, gate_up_names, norm_names, norm_weight, qkv_names
from .kvpool import rope_tables


def kernel_shape_problem(config) -> str | None:
    """Why the kernels cannot run this (Llama-family) config, or None."""
    hd = head_dim_of(config)
    for name, size in (
        ("hidden size", config.hidden_size),
        ("intermediate size", config.intermediate_size),
        ("head dim", hd),
        ("attention width", config.num_attention_heads * hd),
    ):
        if size % 16:
            return f"{name} {size} is not a multiple of 16"
    if hd > 256:
        return f"head dim {hd} is above 256"
    return None


def kernel_model_args(hf_model, max_context: int, state: dict | None = None) -> list:
    """CpuLlama's arguments for a model of a family the fast paths run (family.py): dims, eps, 12 tensors per layer,
    embeddings, final norm, LM head, RoPE tables for max_context positions, each layer's attention window, local
    RoPE tables and which layers use them (Gemma 3), and the family's scalars (the packing flags follow).
    state: the weights by transformers' names, instead of hf_model's; a matrix there may be a GGUF file's quantized
    rows (gguf_blocks.QuantizedRows), which stay so here as a list of parts (quantized_args packs them)."""
    cfg = hf_model.config
    H, nh, nkv = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    hd = head_dim_of(cfg)
    sd = hf_model.state_dict() if state is None else state
    family = family_of(cfg)
    none = torch.empty(0)

    def matrix(value):
        return value.contiguous() if isinstance(value, torch.Tensor) else [value]

    def cat(names: list[str], suffix: str):
        parts = [sd.get(f"{n}.{suffix}") for n in names]
        if parts[0] is None:
            return none
        tensors = [p for p in parts if isinstance(p, torch.Tensor)]
        return torch.cat(tensors).contiguous() if len(tensors) == len(parts) else parts

    def norm(name: str | None) -> torch.Tensor:
        return none if name is None else norm_weight(sd[name + ".weight"], family).float()

    tensors = []
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv, norms, qk = qkv_names(p, family), norm_names(p, family), family.qk_norm
        tensors += [
            norm(norms["input"]),
            cat(qkv, "weight"),
            cat(qkv, "bias").float(),
            matrix(sd[p + "self_attn.o_proj.weight"]),
            sd.get(p + "self_attn.o_proj.bias", none).float(),
            norm(norms["mlp_in"]),
            cat(gate_up_names(p, family), "weight"),
            matrix(sd[p + "mlp.down_proj.weight"]),
            norm(p + "self_attn.q_norm" if qk else None),
            norm(p + "self_attn.k_norm" if qk else None),
            norm(norms.get("attn_out")),
            norm(norms.get("mlp_out")),
        ]
    embed = matrix(sd["model.embed_tokens.weight"])
    lm_head = matrix(sd["lm_head.weight"]) if "lm_head.weight" in sd else embed
    local = "sliding_attention"
    global_kind = "full_attention" if family.rope_kinds else None
    cos, sin = (first_half(t) for t in rope_tables(hf_model, max_context, global_kind))
    local_tables = [first_half(t) for t in rope_tables(hf_model, max_context, local)] if family.rope_kinds else []
    local_layers = [int(family.rope_kind(i) == local) for i in range(cfg.num_hidden_layers)]
    # the embeddings' scale rounded to the weights' dtype, as Gemma's embedding module rounds it
    embed_scale = float(torch.tensor(family.embed_scale).to(embed.dtype)) if family.embed_scale else 0.0
    vocab = lm_head.shape[0] if isinstance(lm_head, torch.Tensor) else lm_head[0].shape[0]
    scalars = [
        embed_scale,
        family.attn_scale or 0.0,
        family.attn_softcap or 0.0,
        family.logit_softcap or 0.0,
        float(family.gelu),
    ]
    dims = [H, nh, nkv, hd, cfg.intermediate_size, cfg.num_hidden_layers, vocab]
    return [
        dims,
        float(cfg.rms_norm_eps),
        tensors,
        embed,
        norm("model.norm"),
        lm_head,
        cos,
        sin,
        list(family.windows),
        local_tables,
        local_layers,
        scalars,
    ]


def first_half(table: torch.Tensor) -> torch.Tensor:
    """A RoPE table (positions, rotated dims) -> its first half of columns, on the CPU: in the rotate-half form both
    halves hold the same angles, so the kernels keep one (cos and sin of 128k positions for a 64-dim head: 32 MB, not
    64)."""
    return table[:, : table.shape[1] // 2].cpu().contiguous()


def four_bit_problem(config) -> str | None:
    """Why the kernels cannot hold a 4-bit copy of this config (groups of 32 along every product's inner size)."""
    for name, size in (
        ("hidden size", config.hidden_size),
        ("intermediate size", config.intermediate_size),
        ("attention width", config.num_attention_heads * head_dim_of(config)),
    ):
        if size % 32:
            return f"{name} {size} is not a multiple of 32"
    return kernel_shape_problem(config)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
