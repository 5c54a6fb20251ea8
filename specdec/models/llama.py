"""A lean forward pass for the Llama family (Llama, SmolLM, Mistral, Qwen2 and 3, Phi-3 and 4-mini, Gemma 2 and 3).

It computes what transformers' LlamaForCausalLM computes, in the same order of operations, but with
fused QKV and gate/up projections, packed weights and a static KV cache of fixed slots, in which
rollback is free: the length is reset and rejected entries are overwritten later. A family's departures from
Llama (family.py: q/k norms, sliding windows, fused projections, partial RoPE, Gemma's norms, GeGLU and soft caps)
are data and small branches in the one pass; each step's arithmetic is a function of ops.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .backend import CausalLM, ForwardOutput, ModelInfo, SequenceCache, tree_positions
from .family import family_of, norm_weight
from .llama_layers import LlamaLayer, llama_layers
from .kvpool import KVPool, PooledCaches, rope_tables
from .ops import Linear, attention_by_row, attention_mask, fitting_groups, padding_groups
from .ops import attend as _attend, gated as _gated, gemma_rms_norm as _gemma_rms_norm  # the per-layer steps
from .ops import rms_norm as _rms_norm, rope as _rope, soft_cap as _soft_cap

if TYPE_CHECKING:
    from .pass_graphs import PassGraphs

GRAPH_MODES = ("off", "eager", "cuda")


class FastLlama(PooledCaches, CausalLM):
    """Llama-family forward in torch, bit-identical to transformers' for Llama, with a KVPool of `slots` sequences."""

    batched = True
    early_exit = True

    def __init__(
        self,
        hf_model,
        info: ModelInfo,
        slots: int = 1,
        max_context: int | None = None,
        graphs: str = "off",
        compile: bool = False,
    ):
        """graphs: "off" (eager passes), "eager" (decode and verify passes shape-static, pass_graphs.py, uncaptured)
        or "cuda" (the same, captured as CUDA graphs); compile: those passes' steps compiled by torch.compile
        (compiled_pass.py), graphs "eager" or "cuda" only."""
        if graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {GRAPH_MODES}, got {graphs!r}")
        if compile and graphs == "off":
            raise ValueError("compile applies to the shape-static passes: graphs must be eager or cuda")
        cfg = hf_model.config
        self.info = info
        self.H = cfg.hidden_size
        self.nh = cfg.num_attention_heads
        self.nkv = cfg.num_key_value_heads
        self.hd = getattr(cfg, "head_dim", None) or self.H // self.nh
        self.eps = cfg.rms_norm_eps
        self.family = family_of(cfg)
        self.max_context = min(max_context or info.max_context, info.max_context)
        sd = hf_model.state_dict()
        pack = info.device.type == "cpu"

        self.norm = _gemma_rms_norm if self.family.gemma_norms else _rms_norm
        fuse = info.dtype != torch.float32
        self.layers = llama_layers(sd, cfg, self.family, (self.nh, self.nkv, self.hd), fuse, pack)
        self.embed = sd["model.embed_tokens.weight"]  # (V, H)
        # Gemma's sqrt(hidden), rounded to the model's dtype as its embedding module rounds it
        scale = self.family.embed_scale
        self.embed_scale = None if scale is None else torch.tensor(scale).to(info.device, info.dtype)
        self.final_norm = norm_weight(sd["model.norm.weight"], self.family)
        self.lm_head = Linear(sd.get("lm_head.weight", self.embed), None, pack)
        self.rope = {}  # rope kind (None: the model's one table) -> cos, sin (max_context, rotated dims)
        for kind in set(self.family.rope_kinds or (None,)):
            cos, sin = rope_tables(hf_model, self.max_context, kind)
            self.rope[kind] = cos.to(info.device, info.dtype), sin.to(info.device, info.dtype)
        self.attn_scale = self.family.attn_scale or self.hd**-0.5
        # Unused cache rows stay zero: SDPA multiplies masked-out values by 0, and 0 * NaN would leak.
        # static passes write padding tokens to a scratch row past the usable ones (static_pass.py)
        rows = self.max_context + (graphs != "off")
        self.pool = KVPool(cfg.num_hidden_layers, slots, self.nkv, rows, self.hd, info.dtype, info.device)
        self.pass_graphs: PassGraphs | None = None
        if graphs != "off":
            from .pass_graphs import PassGraphs

            self.pass_graphs = PassGraphs(self, capture=graphs == "cuda", compile=compile)
            if not compile:  # compiling every bucket at load would take minutes: compiled ones capture at first use
                self.pass_graphs.prepare()

    # ---- forward ----------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(
        self,
        cache,
        input_ids,
        *,
        tree_mask=None,
        output_hidden=False,
        last_only=False,
        layers=None,
        feature_layers=(),
        argmax_only=False,
    ):
        static = self._static([cache], [input_ids], tree_mask, last_only, layers, output_hidden, feature_layers)
        if static is not None:
            return ForwardOutput(logits=static[0][0], hidden=static[0][1] if output_hidden else None)
        out_logits, hidden = self._forward(
            [cache],
            input_ids.view(1, -1),
            [input_ids.numel()],
            tree_mask,
            output_hidden,
            last_only,
            layers,
            feature_layers,
        )
        return ForwardOutput(logits=out_logits[0], hidden=None if hidden is None else hidden[0])

    @torch.inference_mode()
    def forward_batch(
        self,
        caches,
        input_ids,
        *,
        output_hidden=False,
        last_only=False,
        layers=None,
        feature_layers=(),
        argmax_only=False,
    ):
        static = self._static(caches, input_ids, None, last_only, layers, output_hidden, feature_layers)
        if static is not None:
            return [ForwardOutput(logits=lo, hidden=hi if output_hidden else None) for lo, hi in static]
        lengths = [ids.numel() for ids in input_ids]
        groups = fitting_groups([c.length for c in caches], lengths, self.max_context)
        if len(groups) == 1:
            groups = padding_groups(lengths)
        if len(groups) > 1:  # padded to the longest row, the rows together would run past the cache's end, or
            # would mostly compute padding (prompts of unequal lengths)
            outs = {
                i: out
                for group in groups
                for i, out in zip(
                    group,
                    self.forward_batch(
                        [caches[i] for i in group],
                        [input_ids[i] for i in group],
                        output_hidden=output_hidden,
                        last_only=last_only,
                        layers=layers,
                        feature_layers=feature_layers,
                    ),
                )
            }
            return [outs[i] for i in range(len(caches))]
        T = max(lengths)
        padded = torch.zeros(len(caches), T, dtype=torch.long, device=self.info.device)
        for b, ids in enumerate(input_ids):
            padded[b, : lengths[b]] = ids.to(self.info.device)
        logits, hidden = self._forward(caches, padded, lengths, None, output_hidden, last_only, layers, feature_layers)
        return [
            ForwardOutput(
                logits=logits[b] if last_only else logits[b, : lengths[b]],
                hidden=None if hidden is None else hidden[b, : lengths[b]],
            )
            for b in range(len(caches))
        ]

    def _static(
        self,
        caches,
        input_ids,
        tree_mask,
        last_only: bool,
        layers: int | None,
        output_hidden: bool,
        feature_layers: tuple[int, ...] = (),
    ):
        """Each row's (logits, hidden) from a shape-static pass (pass_graphs.py), or None where the eager forward
        runs: graphs off, a prefill's last_only, an early exit, or a pass that fits no bucket."""
        if self.pass_graphs is None or last_only or layers is not None:
            return None
        return self.pass_graphs.run(caches, input_ids, tree_mask, output_hidden, feature_layers)

    def _forward(
        self,
        caches: list[SequenceCache],
        ids: torch.Tensor,
        lengths: list[int],
        tree_mask: torch.Tensor | None,
        output_hidden: bool,
        last_only: bool,
        layers: int | None = None,
        feature_layers: tuple[int, ...] = (),
    ):
        """ids: (B, T), padded; lengths: valid tokens per row. Returns logits (B, T, V), or (B, 1, V) of each
        row's last valid token with last_only, and hidden (B, T, H + A*H): the final state, then the inputs of the A
        feature_layers."""
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
        # per attention window: (B, 1, T, end) or None, and for rows in scattered slots, which attend one at a time
        # as each one's pass alone would (_attention_by_row), each row's mask
        masks = {
            w: (
                attention_mask(starts, T, end, tree_mask, positions, w),
                None
                if contiguous
                else [attention_mask([s], T, s + T, None, positions[b : b + 1], w) for b, s in enumerate(starts)],
            )
            for w in set(self.family.windows[:layers] or (0,))
        }
        angles = {
            kind: (cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))  # (B, 1, T, rotated dims)
            for kind, (cos, sin) in self.rope.items()
        }
        write_at = start_t[:, None] + torch.arange(T, device=device)[None, :]  # (B, T): cache rows written
        x = F.embedding(ids, self.embed)  # (B, T, H)
        if self.embed_scale is not None:
            x = x * self.embed_scale
        feature_inputs = {}  # layer -> its input x (B, T, H), for feature_layers
        for li, layer in enumerate(self.layers[:layers]):
            if output_hidden and not layers and li in feature_layers:
                feature_inputs[li] = x
            mask, row_masks = masks[layer.window]
            q, k, v = self._qkv(layer, x, *angles[layer.rope_kind])
            kc, vc = self.pool.keys[li], self.pool.values[li]  # (S, nkv, P, hd)
            if B == 1:
                kc[slots[0], :, starts[0] : starts[0] + T] = k[0].transpose(0, 1)
                vc[slots[0], :, starts[0] : starts[0] + T] = v[0].transpose(0, 1)
            else:
                kc[slot_t[:, None], :, write_at] = k
                vc[slot_t[:, None], :, write_at] = v
            if contiguous:
                keys, values = kc[slots[0] : slots[0] + B, :, :end], vc[slots[0] : slots[0] + B, :, :end]
                attn = _attend(q, keys, values, mask, self.attn_scale, self.family.attn_softcap)
            else:
                assert row_masks is not None  # made for scattered slots (above)
                attn = attention_by_row(q, kc, vc, slots, starts, row_masks, self.attn_scale, self.family.attn_softcap)
            x = self._finish_layer(layer, x, attn)
        for c, n in zip(caches, lengths):
            c.length += n
        x = self._final_norm(x)
        hidden = None
        if output_hidden:
            hidden = torch.cat([x] + [feature_inputs[i] for i in feature_layers if i in feature_inputs], dim=-1)
        if last_only:  # the LM head runs on each row's last token only
            x = (
                x[:, -1:]
                if B == 1
                else x[torch.arange(B, device=device), torch.tensor(lengths, device=device) - 1, None]
            )
        logits = _soft_cap(self.lm_head(x), self.family.logit_softcap)
        return logits, hidden

    def _qkv(self, layer: LlamaLayer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """A layer's rotated queries (B, nh, T, hd), keys (B, T, nkv, hd) and values (B, T, nkv, hd) of x (B, T, H);
        cos, sin: (B, 1, T, rotated dims) of the tokens' positions in the layer's RoPE table. Shared by the eager and
        the shape-static pass."""
        B, T, _ = x.shape
        nh, nkv, hd = self.nh, self.nkv, self.hd
        h = self.norm(x, layer.input_norm, self.eps)
        q, k, v = layer.qkv(h)
        q, k = q.view(B, T, nh, hd), k.view(B, T, nkv, hd)
        if layer.q_norm is not None and layer.k_norm is not None:  # both or neither (family.py)
            q, k = self.norm(q, layer.q_norm, self.eps), self.norm(k, layer.k_norm, self.eps)
        q = _rope(q.transpose(1, 2), cos, sin)  # (B, nh, T, hd)
        k = _rope(k.transpose(1, 2), cos, sin).transpose(1, 2)  # (B, T, nkv, hd)
        return q, k, v.view(B, T, nkv, hd)

    def _finish_layer(self, layer: LlamaLayer, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        """The residual stream (B, T, H) after a layer whose attention output is attn (B, nh, T, hd): the output
        projection, then the MLP (each with its output norm where the family has one)."""
        B, T, _ = x.shape
        a = layer.o(attn.transpose(1, 2).reshape(B, T, self.nh * self.hd))
        x = x + (a if layer.attn_out_norm is None else self.norm(a, layer.attn_out_norm, self.eps))
        h = self.norm(x, layer.post_norm, self.eps)
        gate, up = layer.gate_up(h)
        m = layer.down(_gated(gate, up, self.family.gelu))
        return x + (m if layer.mlp_out_norm is None else self.norm(m, layer.mlp_out_norm, self.eps))

    def _final_norm(self, x: torch.Tensor) -> torch.Tensor:
        """The final norm of the residual stream x (B, T, H): the LM head's input."""
        return self.norm(x, self.final_norm, self.eps)
