"""A lean forward pass for the Llama family (Llama, Mistral without sliding window, Qwen2, SmolLM).

It computes what transformers' LlamaForCausalLM computes, in the same order of operations, but with
fused QKV and gate/up projections, packed weights and a static KV cache of fixed slots, in which
rollback is free: the length is reset and rejected entries are overwritten later.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .backend import CausalLM, ForwardOutput, ModelInfo, SequenceCache, tree_positions
from .kvpool import KVPool, PooledCaches, rope_tables
from .linear import FusedLinear, Linear

SUPPORTED_TYPES = ("llama", "mistral", "qwen2")
GRAPH_MODES = ("off", "eager", "cuda")
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


def fast_path_problem(config) -> str | None:
    """Why this config cannot take the fast path, or None when it can."""
    if config.model_type not in SUPPORTED_TYPES:
        return f"model type {config.model_type!r} is not one of {SUPPORTED_TYPES}"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "MLP biases"
    window = getattr(config, "sliding_window", None)
    if window is not None and getattr(config, "use_sliding_window", True) and window < config.max_position_embeddings:
        return "sliding-window attention"
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in STATIC_ROPE_TYPES:
        return f"RoPE type {rope_type!r}"
    return None


@dataclass
class _Layer:
    input_norm: torch.Tensor  # (H,)
    qkv: FusedLinear  # H -> (nh * hd, nkv * hd, nkv * hd)
    o: Linear  # nh * hd -> H
    post_norm: torch.Tensor  # (H,)
    gate_up: FusedLinear  # H -> (I, I)
    down: Linear  # I -> H


class FastLlama(PooledCaches, CausalLM):
    """Llama-family forward in torch, bit-identical to transformers', with a KVPool of `slots` sequences."""

    batched = True

    def __init__(self, hf_model, info: ModelInfo, slots: int = 1, max_context: int | None = None,
                 graphs: str = "off"):
        """graphs: "off" (eager passes), "eager" (decode and verify passes shape-static, pass_graphs.py, uncaptured)
        or "cuda" (the same, captured as CUDA graphs)."""
        if graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {GRAPH_MODES}, got {graphs!r}")
        cfg = hf_model.config
        self.info = info
        self.H = cfg.hidden_size
        self.nh = cfg.num_attention_heads
        self.nkv = cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or self.H // self.nh
        self.eps = cfg.rms_norm_eps
        self.max_context = min(max_context or info.max_context, info.max_context)
        sd = hf_model.state_dict()
        pack = info.device.type == "cpu"

        fuse = info.dtype != torch.float32

        def proj(names: list[str]) -> FusedLinear:
            return FusedLinear([sd[n + ".weight"] for n in names], [sd.get(n + ".bias") for n in names], fuse, pack)

        self.layers = []
        for i in range(cfg.num_hidden_layers):
            p = f"model.layers.{i}."
            self.layers.append(_Layer(
                input_norm=sd[p + "input_layernorm.weight"],
                qkv=proj([p + "self_attn.q_proj", p + "self_attn.k_proj", p + "self_attn.v_proj"]),
                o=Linear(sd[p + "self_attn.o_proj.weight"], sd.get(p + "self_attn.o_proj.bias"), pack),
                post_norm=sd[p + "post_attention_layernorm.weight"],
                gate_up=proj([p + "mlp.gate_proj", p + "mlp.up_proj"]),
                down=Linear(sd[p + "mlp.down_proj.weight"], None, pack),
            ))
        self.embed = sd["model.embed_tokens.weight"]  # (V, H)
        self.final_norm = sd["model.norm.weight"]
        self.lm_head = Linear(sd.get("lm_head.weight", self.embed), None, pack)
        cos, sin = rope_tables(hf_model, self.max_context)
        self.cos, self.sin = cos.to(info.device, info.dtype), sin.to(info.device, info.dtype)
        # Unused cache rows stay zero: SDPA multiplies masked-out values by 0, and 0 * NaN would leak.
        # static passes write padding tokens to a scratch row past the usable ones (static_pass.py)
        rows = self.max_context + (graphs != "off")
        self.pool = KVPool(cfg.num_hidden_layers, slots, self.nkv, rows, self.hd, info.dtype, info.device)
        self.pass_graphs = None
        if graphs != "off":
            from .pass_graphs import PassGraphs

            self.pass_graphs = PassGraphs(self, capture=graphs == "cuda")
            self.pass_graphs.prepare()

    # ---- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, cache, input_ids, *, tree_mask=None, output_hidden=False, last_only=False, layers=None):
        static = self._static([cache], [input_ids], tree_mask, last_only, layers)
        if static is not None:
            return ForwardOutput(logits=static[0][0], hidden=static[0][1] if output_hidden else None)
        out_logits, hidden = self._forward([cache], input_ids.view(1, -1), [input_ids.numel()], tree_mask,
                                           output_hidden, last_only, layers)
        return ForwardOutput(logits=out_logits[0], hidden=None if hidden is None else hidden[0])

    @torch.inference_mode()
    def forward_batch(self, caches, input_ids, *, output_hidden=False, last_only=False, layers=None):
        static = self._static(caches, input_ids, None, last_only, layers)
        if static is not None:
            return [ForwardOutput(logits=lo, hidden=hi if output_hidden else None) for lo, hi in static]
        lengths = [ids.numel() for ids in input_ids]
        groups = _fitting_groups([c.length for c in caches], lengths, self.max_context)
        if len(groups) == 1:
            groups = _padding_groups(lengths)
        if len(groups) > 1:  # padded to the longest row, the rows together would run past the cache's end, or
            # would mostly compute padding (prompts of unequal lengths)
            outs = {i: out for group in groups for i, out in zip(group, self.forward_batch(
                [caches[i] for i in group], [input_ids[i] for i in group], output_hidden=output_hidden,
                last_only=last_only, layers=layers))}
            return [outs[i] for i in range(len(caches))]
        T = max(lengths)
        padded = torch.zeros(len(caches), T, dtype=torch.long, device=self.info.device)
        for b, ids in enumerate(input_ids):
            padded[b, : lengths[b]] = ids.to(self.info.device)
        logits, hidden = self._forward(caches, padded, lengths, None, output_hidden, last_only, layers)
        return [ForwardOutput(logits=logits[b] if last_only else logits[b, : lengths[b]],
                              hidden=None if hidden is None else hidden[b, : lengths[b]])
                for b in range(len(caches))]

    def _static(self, caches, input_ids, tree_mask, last_only: bool, layers: int | None):
        """Each row's (logits, hidden) from a shape-static pass (pass_graphs.py), or None where the eager forward
        runs: graphs off, a prefill's last_only, an early exit, or a pass that fits no bucket."""
        if self.pass_graphs is None or last_only or layers is not None:
            return None
        return self.pass_graphs.run(caches, input_ids, tree_mask)

    def _forward(self, caches: list[SequenceCache], ids: torch.Tensor, lengths: list[int],
                 tree_mask: torch.Tensor | None, output_hidden: bool, last_only: bool, layers: int | None = None):
        """ids: (B, T), padded; lengths: valid tokens per row. Returns logits (B, T, V), or (B, 1, V) of each
        row's last valid token with last_only, and hidden (B, T, H)."""
        device = self.info.device
        ids = ids.to(device)
        B, T = ids.shape
        starts = [c.length for c in caches]
        end = max(starts) + T
        if end > self.max_context:
            raise ValueError(f"sequence of {end} tokens exceeds the cache's {self.max_context}")
        offsets = torch.arange(T, device=device)
        if tree_mask is not None:
            tree_mask = tree_mask.to(device)
            offsets = tree_positions(tree_mask)
        start_t = torch.tensor(starts, device=device)
        positions = start_t[:, None] + offsets[None, :]  # (B, T)
        slots = [c.slot for c in caches]
        contiguous = slots == list(range(slots[0], slots[0] + B))
        slot_t = torch.tensor(slots, device=device)
        mask = self._attention_mask(starts, T, end, tree_mask)  # (B, 1, T, end) or None
        # rows in scattered slots attend one at a time, each as its pass alone would (_attention_by_row)
        row_masks = None if contiguous else [self._attention_mask([s], T, s + T, None) for s in starts]
        cos = self.cos[positions].unsqueeze(1)  # (B, 1, T, hd)
        sin = self.sin[positions].unsqueeze(1)
        write_at = start_t[:, None] + torch.arange(T, device=device)[None, :]  # (B, T): cache rows written
        x = F.embedding(ids, self.embed)  # (B, T, H)
        nh, nkv, hd = self.nh, self.nkv, self.hd
        feature_inputs = {}  # layer -> its input x (B, T, H), for feature_layers
        for li, layer in enumerate(self.layers[:layers]):
            if output_hidden and not layers and li in self.feature_layers:
                feature_inputs[li] = x
            q, k, v = self._qkv(layer, x, cos, sin)
            kc, vc = self.pool.keys[li], self.pool.values[li]  # (S, nkv, P, hd)
            if B == 1:
                kc[slots[0], :, starts[0]:starts[0] + T] = k[0].transpose(0, 1)
                vc[slots[0], :, starts[0]:starts[0] + T] = v[0].transpose(0, 1)
            else:
                kc[slot_t[:, None], :, write_at] = k
                vc[slot_t[:, None], :, write_at] = v
            if contiguous:
                keys, values = kc[slots[0]:slots[0] + B, :, :end], vc[slots[0]:slots[0] + B, :, :end]
                attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=hd ** -0.5,
                                                      is_causal=mask is None and T > 1, enable_gqa=nkv != nh)
            else:
                attn = _attention_by_row(q, kc, vc, slots, starts, row_masks, hd ** -0.5, nkv != nh)
            x = self._finish_layer(layer, x, attn)
        for c, n in zip(caches, lengths):
            c.length += n
        x = self._final_norm(x)
        hidden = None
        if output_hidden:
            hidden = torch.cat([x] + [feature_inputs[i] for i in self.feature_layers if i in feature_inputs], dim=-1)
        if last_only:  # the LM head runs on each row's last token only
            x = x[:, -1:] if B == 1 else x[torch.arange(B, device=device), torch.tensor(lengths, device=device) - 1, None]
        logits = self.lm_head(x)
        return logits, hidden

    def _qkv(self, layer: _Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """A layer's rotated queries (B, nh, T, hd), keys (B, T, nkv, hd) and values (B, T, nkv, hd) of x (B, T, H);
        cos, sin: (B, 1, T, hd) of the tokens' positions. Shared by the eager and the shape-static pass."""
        B, T, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        h = _rms_norm(x, layer.input_norm, self.eps)
        q, k, v = layer.qkv(h)
        q = q.view(B, T, nh, hd).transpose(1, 2)  # (B, nh, T, hd)
        k = k.view(B, T, nkv, hd).transpose(1, 2)  # (B, nkv, T, hd)
        v = v.view(B, T, nkv, hd)
        q = q * cos + _rotate_half(q) * sin
        k = (k * cos + _rotate_half(k) * sin).transpose(1, 2)  # (B, T, nkv, hd)
        return q, k, v

    def _finish_layer(self, layer: _Layer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream (B, T, H) after a layer whose attention output is attn (B, nh, T, hd): the output
        projection, then the MLP."""
        B, T, _ = x.shape
        x = x + layer.o(attn.transpose(1, 2).reshape(B, T, self.nh * self.hd))
        h = _rms_norm(x, layer.post_norm, self.eps)
        gate, up = layer.gate_up(h)
        return x + layer.down(F.silu(gate) * up)

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm of the residual stream x (B, T, H): the LM head's input."""
        return _rms_norm(x, self.final_norm, self.eps)

    def _attention_mask(self, starts: list[int], T: int, end: int, tree_mask: torch.Tensor | None):
        """(B, 1, T, end) bool: query t of row b sees cached keys < starts[b] and its new ancestors.

        None where plain causal attention over all keys is exact (one row, prefill or one token).
        """
        B = len(starts)
        if B == 1 and tree_mask is None and (T == 1 or starts[0] == 0):
            return None
        device = self.info.device
        if tree_mask is not None:
            if B != 1:
                raise ValueError("tree attention takes one sequence at a time")
            visible = torch.zeros(T, end, dtype=torch.bool, device=device)
            visible[:, : starts[0]] = True
            visible[:, starts[0]: starts[0] + T] = tree_mask
            return visible[None, None]
        key = torch.arange(end, device=device)[None, None, :]  # (1, 1, end)
        start = torch.tensor(starts, device=device)[:, None, None]  # (B, 1, 1)
        query = torch.arange(T, device=device)[None, :, None]  # (1, T, 1)
        rel = key - start  # (B, 1, end): key offset among this row's new tokens
        return (rel <= query).unsqueeze(1)  # (B, 1, T, end): cached keys have rel < 0


def _fitting_groups(starts: list[int], lengths: list[int], capacity: int) -> list[list[int]]:
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


def _attention_by_row(q, keys, values, slots: list[int], starts: list[int], masks: list, scale: float,
                      gqa: bool) -> torch.Tensor:
    """Attention (B, nh, T, hd) of each row of q (B, nh, T, hd) over its own slot's cached keys and values (S, nkv,
    P, hd), read in place up to that row's end. Gathering scattered slots into one tensor would copy every row's
    cache up to the longest row's end, in each layer (for 32 rows of 1k tokens in float32, 1.5 GB a step: half the
    soak's decode time); each row's small pass here reads views and equals its pass alone."""
    T = q.shape[2]
    return torch.cat([F.scaled_dot_product_attention(
        q[b:b + 1], keys[slot:slot + 1, :, :start + T], values[slot:slot + 1, :, :start + T], attn_mask=mask,
        scale=scale, is_causal=mask is None and T > 1, enable_gqa=gqa)
        for b, (slot, start, mask) in enumerate(zip(slots, starts, masks))])


PAD_WASTE_TOKENS = 32  # about what one more pass costs on a CPU (its weights read again), in token rows


def _padding_groups(lengths: list[int], waste: int = PAD_WASTE_TOKENS) -> list[list[int]]:
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


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm in float32, cast back, then scaled: exactly transformers' LlamaRMSNorm."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
