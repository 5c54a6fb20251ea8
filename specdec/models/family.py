"""What each model family's decoder adds to Llama's, as data read from its config.

specdec's fast forwards (llama.py in torch, kernel_llama.py on the CPU kernels) are one Llama-shaped pass; a
family's differences are a `Family` that pass branches on, never a forward of its own. `fast_path_problem` names
what a config needs that the fast paths lack, so such a model runs on transformers' own forward instead.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "phi3", "gemma2", "gemma3_text")
GEMMA_TYPES = ("gemma2", "gemma3_text")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


@dataclass(frozen=True)
class Family:
    """A config's departures from Llama that the fast forwards implement.

    qk_norm: an RMSNorm over each head's query and key (weights (head_dim,)) between the projection and RoPE (Qwen3,
    Gemma 3).
    windows: per layer, how many positions a query sees back, itself included: keys at positions <= p - window are
    invisible to a query at p (0: every earlier key is visible).
    fused: q, k and v in one weight (qkv_proj), gate and up in another (gate_up_proj), as Phi-3 stores them.
    context_limit: the longest sequence the static RoPE tables are exact for (LongRoPE switches to its long factors
    past original_max_position_embeddings, for a whole pass at once), or None.
    RoPE on part of each head (Phi-4-mini's partial_rotary_factor) needs no field: the tables' width says it.
    Gemma's: gemma_norms: every RMSNorm scales by (1 + w), in float32 before the cast to the model's dtype;
    sandwich: norms on the attention's and the MLP's outputs too, before each joins the residual stream;
    gelu: GeGLU (tanh-approximated GELU of the gate) instead of SwiGLU; embed_scale: the embeddings times this
    (sqrt(hidden), rounded to the model's dtype); attn_scale: the scores' scale (query_pre_attn_scalar ** -0.5; None:
    head_dim ** -0.5); attn_softcap, logit_softcap: scores and final logits become cap * tanh(x / cap);
    rope_kinds: per layer, which of the rotary embedding's tables it uses (its layer type: Gemma 3's local and global
    bases); empty: one table for all.
    """

    qk_norm: bool = False
    windows: tuple[int, ...] = ()
    fused: bool = False
    context_limit: int | None = None
    gemma_norms: bool = False
    sandwich: bool = False
    gelu: bool = False
    embed_scale: float | None = None
    attn_scale: float | None = None
    attn_softcap: float | None = None
    logit_softcap: float | None = None
    rope_kinds: tuple[str, ...] = ()

    def window(self, layer: int) -> int:
        return self.windows[layer] if self.windows else 0

    def rope_kind(self, layer: int) -> str | None:
        return self.rope_kinds[layer] if self.rope_kinds else None


def family_of(config) -> Family:
    """The Family of a config that fast_path_problem accepts."""
    limit = None
    if _rope_type(config) == "longrope":
        rope = _rope_parameters(config)
        limit = rope.get("original_max_position_embeddings") or config.original_max_position_embeddings
    if config.model_type not in GEMMA_TYPES:
        return Family(
            qk_norm=config.model_type == "qwen3",
            windows=layer_windows(config),
            fused=config.model_type == "phi3",
            context_limit=limit,
        )
    return Family(
        qk_norm=config.model_type == "gemma3_text",
        windows=layer_windows(config),
        context_limit=limit,
        gemma_norms=True,
        sandwich=True,
        gelu=True,
        embed_scale=config.hidden_size**0.5,
        attn_scale=config.query_pre_attn_scalar**-0.5,
        attn_softcap=config.attn_logit_softcapping,
        logit_softcap=config.final_logit_softcapping,
        rope_kinds=tuple(config.layer_types) if config.model_type == "gemma3_text" else (),
    )


def qkv_names(prefix: str, family: Family) -> list[str]:
    """The state-dict names (without .weight/.bias) of layer `prefix`'s q, k and v projections, or their fused one."""
    if family.fused:
        return [prefix + "self_attn.qkv_proj"]
    return [prefix + "self_attn.q_proj", prefix + "self_attn.k_proj", prefix + "self_attn.v_proj"]


def gate_up_names(prefix: str, family: Family) -> list[str]:
    if family.fused:
        return [prefix + "mlp.gate_up_proj"]
    return [prefix + "mlp.gate_proj", prefix + "mlp.up_proj"]


def layer_windows(config) -> tuple[int, ...]:
    """Each layer's attention window (0: none), as transformers applies it: Mistral's `sliding_window` in every
    layer; Qwen2's and Qwen3's in the layers `layer_types` marks "sliding_attention" (None unless use_sliding_window).
    A window as long as the model's context changes nothing, so it counts as none."""
    window = getattr(config, "sliding_window", None) or 0
    if window >= getattr(config, "max_position_embeddings", float("inf")):
        window = 0
    layers = config.num_hidden_layers
    if not window:
        return (0,) * layers
    types = getattr(config, "layer_types", None)
    if config.model_type in ("mistral", "phi3") or types is None:  # their modeling windows every layer
        return (window,) * layers
    return tuple(window if kind == "sliding_attention" else 0 for kind in types)


def fast_path_problem(config) -> str | None:
    """What this config needs that the fast paths (torch forward, CPU kernels) lack, or None when they run it."""
    if config.model_type not in SUPPORTED_TYPES:
        return f"model type {config.model_type!r} (the fast paths run {', '.join(SUPPORTED_TYPES)})"
    activation = _activation(config)
    if activation != ("gelu_pytorch_tanh" if config.model_type in GEMMA_TYPES else "silu"):
        return f"the activation {activation!r}"
    if getattr(config, "use_bidirectional_attention", False):
        return "bidirectional attention"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    types = getattr(config, "layer_types", None) or ()
    unknown = sorted(set(types) - {"full_attention", "sliding_attention"})
    if unknown:
        return f"layer types {unknown}"
    rope_type = _rope_type(config)
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r}"
    return None


def _activation(config) -> str:
    if config.model_type in GEMMA_TYPES:  # Gemma's modeling reads hidden_activation
        return getattr(config, "hidden_activation", None) or config.hidden_act
    return getattr(config, "hidden_act", "silu")


def _rope_parameters(config) -> dict:
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    return rope if isinstance(rope, dict) else {}


def _rope_type(config) -> str:
    """The RoPE type; for configs with a RoPE per layer type (Gemma 3), the first that is not "default"."""
    rope = _rope_parameters(config)
    if all(isinstance(v, dict) for v in rope.values()) and rope:
        kinds = [v.get("rope_type", v.get("type", "default")) for v in rope.values()]
        return next((k for k in kinds if k != "default"), "default")
    return rope.get("rope_type", rope.get("type", "default"))


def norm_names(prefix: str, family: Family) -> dict[str, str]:
    """The state-dict names (without .weight) of layer `prefix`'s norms by role: "input" (before attention), "mlp_in"
    (before the MLP) and, with sandwich norms, "attn_out" and "mlp_out" (on each one's output)."""
    if not family.sandwich:
        return {"input": prefix + "input_layernorm", "mlp_in": prefix + "post_attention_layernorm"}
    return {
        "input": prefix + "input_layernorm",
        "attn_out": prefix + "post_attention_layernorm",
        "mlp_in": prefix + "pre_feedforward_layernorm",
        "mlp_out": prefix + "post_feedforward_layernorm",
    }


def norm_weight(weight, family: Family):
    """A norm's weight as the forward multiplies by it: Gemma's 1 + w in float32, else w itself."""
    return 1.0 + weight.float() if family.gemma_norms else weight
