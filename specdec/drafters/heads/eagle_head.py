"""An EAGLE-style draft head: the target's features and the next token in, the next feature out.

At position t the head reads f_t (the target's final hidden state, (H,)) and e(x_{t+1}) (the target's
frozen embedding of the next token), mixes them with fc (2H -> H), runs one Llama decoder layer over
the sequence of such pairs, and outputs h_{t+1}, its guess of f_{t+1}. The target's frozen LM head,
restricted to a draft vocabulary of frequent tokens (K rows), turns h_{t+1} into logits for x_{t+2}.
Drafting feeds the head its own guesses: (h_{t+1}, x_{t+2}) -> h_{t+2}, and so on.

Loading a head from a folder (specdec's own or the EAGLE authors' layout) is eagle_loading.py's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...models.ops import rotate_half

HEAD_FILE, CONFIG_FILE = "eagle_head.safetensors", "eagle_config.json"


@dataclass(frozen=True)
class EagleConfig:
    target: str | None  # the target's name (alias, folder or hub id) when trained; None: a head from elsewhere
    target_fingerprint: str | None  # a hash of the target's embedding table: a head loads onto its own target only
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    vocab_size: int  # the target's
    draft_vocab_size: int  # K, rows of the LM head the head scores
    input_norm: bool = True  # RMS norm before attention; EAGLE-1/2's published heads have none
    fc_bias: bool = True  # False: fc's bias stays zero and untrained, as vLLM's EAGLE-1 layer builds fc without one

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)


def target_fingerprint(embed: torch.Tensor) -> str:
    """sha256 of every 97th embedding row rounded to bfloat16 (the same for any load dtype)."""
    sample = embed[::97].detach().to("cpu", torch.bfloat16).float().contiguous()
    return hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]


def config_for_target(hf_model, name: str, draft_vocab_size: int) -> EagleConfig:
    cfg = hf_model.config
    return EagleConfig(
        target=name,
        target_fingerprint=target_fingerprint(hf_model.get_input_embeddings().weight),
        hidden_size=cfg.hidden_size,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        intermediate_size=cfg.intermediate_size,
        rms_norm_eps=cfg.rms_norm_eps,
        vocab_size=hf_model.get_output_embeddings().weight.shape[0],
        draft_vocab_size=draft_vocab_size,
    )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight * x / sqrt(mean(x^2) + eps), computed in float32, returned in x's dtype."""
    h = x.float()
    return (weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps))).to(x.dtype)


class HeadLayer(nn.Module):
    """The decoder layer EAGLE heads share: attention whose projections read `attention_input` features, o_proj
    back to H, a norm and a SwiGLU MLP. Subclasses add what comes before and after it."""

    # the frozen buffers every head registers (register_buffer)
    embed: torch.Tensor  # (V, H) the target's embeddings
    draft_ids: torch.Tensor  # (K,) draft index -> token id
    inv_freq: torch.Tensor  # RoPE's inverse frequencies

    def __init__(self, config, attention_input: int):
        super().__init__()
        c = self.config = config
        H, nh, nkv, hd = c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim
        self.q_proj = nn.Linear(attention_input, nh * hd, bias=False)
        self.k_proj = nn.Linear(attention_input, nkv * hd, bias=False)
        self.v_proj = nn.Linear(attention_input, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, H, bias=False)
        self.post_norm = RMSNorm(H, c.rms_norm_eps)
        self.gate_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(H, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, H, bias=False)

    def layer(self, x: torch.Tensor, h: torch.Tensor, positions: torch.Tensor, past=None, mask=None):
        """The residual stream x (B, T, H) after attention over h (B, T, attention_input) and the MLP:
        (x (B, T, H), (keys, values) of these T pairs); past and mask as in EagleHead.forward."""
        attn, new_kv = attention(
            self.q_proj(h), self.k_proj(h), self.v_proj(h), self.config, positions, self.inv_freq, past, mask
        )
        x = x + self.o_proj(attn)
        h = self.post_norm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h)), new_kv

    def _apply(self, fn, recurse=True):
        """Casts and moves as nn.Module does, except that the RoPE frequencies stay float32: rounded to
        bfloat16 they would shift the angles of far positions by radians."""
        inv_freq = self.inv_freq
        super()._apply(fn, recurse)
        self.inv_freq = inv_freq.to(self.inv_freq.device)
        return self

    def trainable_state(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().contiguous() for k, v in self.state_dict().items()}


class EagleHead(HeadLayer):
    """Trainable parts: fc, one decoder layer, norms. Frozen buffers: embedding, draft LM head, RoPE."""

    feature_layers: tuple[int, ...] = ()  # reads the target's final hidden state only
    predicts_features = True  # its output is trained towards the target's next feature
    draft_lm_head: torch.Tensor  # (K, H) a frozen buffer: the target's LM head rows of the draft vocabulary

    def __init__(
        self,
        config: EagleConfig,
        embed: torch.Tensor,
        lm_head: torch.Tensor,
        draft_ids: torch.Tensor,
        inv_freq: torch.Tensor,
    ):
        H = config.hidden_size
        super().__init__(config, attention_input=H)
        self.fc = nn.Linear(2 * H, H, bias=True)
        if not config.fc_bias:  # kept as a zero tensor so that every head's state has the same names
            self.fc.bias.requires_grad_(False)
            nn.init.zeros_(self.fc.bias)
        self.input_norm = RMSNorm(H, config.rms_norm_eps) if config.input_norm else nn.Identity()
        self.register_buffer("embed", embed.detach(), persistent=False)  # (V, H)
        self.register_buffer("draft_lm_head", lm_head.detach()[draft_ids], persistent=False)  # (K, H)
        self.register_buffer("draft_ids", draft_ids.long(), persistent=False)  # (K,) draft index -> token id
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    # ---- the network ------------------------------------------------------------------------------
    def forward(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ):
        """features (B, T, H), tokens (B, T): pairs (f_t, x_{t+1}); positions (B, T) of t.

        past: cached keys and values (B, nkv, S, hd) of earlier pairs; mask (B, 1, T, S + T) bool, or None
        for causal order over past + new. Returns (hidden (B, T, H), (keys, values) of these T pairs).
        """
        x = self.fc(torch.cat([self.embed[tokens].to(features.dtype), features], dim=-1))
        return self.layer(x, self.input_norm(x), positions, past, mask)

    @property
    def feature_dtype(self) -> torch.dtype:
        """The dtype features are cast to before they enter the head."""
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's final hidden states (..., H) as the head reads them (EAGLE-3 heads fuse several layers)."""
        return features.to(self.feature_dtype)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) logits over the draft vocabulary."""
        return hidden @ self.draft_lm_head.to(hidden.dtype).T

    # ---- files ------------------------------------------------------------------------------------
    def save(self, folder: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
        from safetensors.torch import save_file

        from ...files import write_atomic, write_text_atomic

        folder.mkdir(parents=True, exist_ok=True)
        tensors = {k: v.to(dtype) for k, v in self.trainable_state().items()}
        tensors["draft_ids"] = self.draft_ids.to(torch.int64).contiguous()
        write_atomic(
            folder / HEAD_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "specdec-eagle-head"})
        )
        data = json.loads(self.config.to_json())
        if extra:
            data["training"] = extra
        write_text_atomic(folder / CONFIG_FILE, json.dumps(data, indent=1))


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    c: EagleConfig,
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    past=None,
    mask: torch.Tensor | None = None,
):
    """The head's self-attention from projected q (B, T, nh*hd), k, v (B, T, nkv*hd), before RoPE.

    Returns (attended (B, T, nh*hd), (keys, values) (B, nkv, T, hd) of these T pairs); past and mask as in
    EagleHead.forward.
    """
    B, T, _ = q.shape
    q = q.view(B, T, c.num_heads, c.head_dim).transpose(1, 2)
    k = k.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
    v = v.view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
    freqs = positions[..., None].float() * inv_freq  # (B, T, hd/2), float32 whatever the head's dtype
    angles = torch.cat([freqs, freqs], dim=-1)
    cos, sin = angles.cos().to(q.dtype)[:, None], angles.sin().to(q.dtype)[:, None]  # (B, 1, T, hd)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    new_kv = (k, v)
    if past is not None:
        k = torch.cat([past[0], k], dim=2)
        v = torch.cat([past[1], v], dim=2)
    causal = mask is None and past is None and T > 1
    if mask is None and past is not None and T > 1:
        S = k.shape[2] - T
        mask = torch.ones(T, S + T, dtype=torch.bool, device=q.device).tril(S)[None, None]
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=c.num_kv_heads != c.num_heads
    )
    return out.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim), new_kv


def new_head(hf_model, name: str, draft_ids: torch.Tensor, input_norm: bool = True, fc_bias: bool = True) -> EagleHead:
    """A freshly initialised head for this target (fc starts near [identity on the feature half]); input_norm and
    fc_bias False: without the norm before attention and the fc bias, as the EAGLE authors' heads."""
    config = replace(config_for_target(hf_model, name, len(draft_ids)), input_norm=input_norm, fc_bias=fc_bias)
    head = EagleHead(config, *frozen_parts(hf_model, draft_ids))
    with torch.no_grad():
        H = config.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, H:] = torch.eye(H)
        head.fc.weight[:, :H].normal_(0, 0.02)
        head.fc.bias.zero_()
        for lin in (head.o_proj, head.down_proj):
            lin.weight.mul_(0.1)
    return head


def frozen_parts(hf_model, draft_ids: torch.Tensor | None):
    """The target's embedding (V, H) and LM head (V, H) float32 on the CPU, draft_ids (K,) as given, and its RoPE
    inverse frequencies (hd/2,)."""
    embed = hf_model.get_input_embeddings().weight.detach().float().cpu()
    lm_head = hf_model.get_output_embeddings().weight.detach().float().cpu()
    head_dim = (
        getattr(hf_model.config, "head_dim", None) or hf_model.config.hidden_size // hf_model.config.num_attention_heads
    )
    return embed, lm_head, draft_ids, head_inv_freq(hf_model, head_dim)


def head_inv_freq(hf_model, head_dim: int) -> torch.Tensor:
    """The RoPE inverse frequencies (head_dim/2,) float32 a head turns its whole heads by: the target's, or where the
    target turns only part of each head or keeps a table per layer type (Phi-4-mini, Gemma 3), the default ones at
    its (global) base."""
    inv_freq = getattr(hf_model.model.rotary_emb, "inv_freq", None)
    if inv_freq is not None and inv_freq.numel() * 2 == head_dim:
        return inv_freq.detach().float().cpu()
    rope = getattr(hf_model.config, "rope_parameters", None) or {}
    base = rope.get("full_attention", rope).get("rope_theta", 10000.0)
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
