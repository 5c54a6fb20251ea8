"""The EAGLE head's drafting pass on specdec's CPU kernels.

The same network as EagleHead.forward, with each product packed once for the kernels: the decoder layer is one
native call (HeadLayer, kernels/head_layer.h: norms, products, RoPE, attention over the cached keys and the MLP), the
fc and the draft LM head are PackedLinear products. For the few rows a draft level scores this costs a fraction of
torch's many small operations. Activations and keys/values are float32; with bfloat16 weights the products round
their inputs to bfloat16 on CPUs with AVX-512 BF16, as the kernels-bf16 backend does.
"""

from __future__ import annotations

import torch

from .eagle3_head import Eagle3Config, Eagle3Head
from .eagle_head import EagleConfig, EagleHead, rms_norm


def kernel_head_problem(config: EagleConfig | Eagle3Config) -> str | None:
    """Why the kernels cannot run this head, or None (they need the products' inner sizes and the head dim, which
    their attention reads 16 lanes at a time, in multiples of 16; head_dim at most 256)."""
    from ...kernels import unavailable_reason

    sizes = {
        "hidden size": config.hidden_size,
        "intermediate size": config.intermediate_size,
        "head dim": config.head_dim,
    }
    odd = [f"{name} {size}" for name, size in sizes.items() if size % 16]
    if odd:
        return f"{', '.join(odd)} not a multiple of 16"
    if config.head_dim > 256:
        return f"head dim {config.head_dim} over 256"
    return unavailable_reason()


def head_bits(target, config: EagleConfig | Eagle3Config) -> int:
    """How the kernels keep a head's weights for `target` (a LoadedModel): 8-bit where the target runs a GGUF
    file's quantized weights (the head then costs what the target's own products cost a byte, a quarter of
    float32's bytes), where the products' inner sizes allow groups of 32; else 0 (as the target's dtype)."""
    inner = (config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim)
    return 8 if target.backend.quantized_weights and all(size % 32 == 0 for size in inner) else 0


def stacked(*weights: torch.Tensor, bfloat16: bool) -> torch.Tensor:
    """The weights' rows stacked in order, detached, contiguous, in bfloat16 or float32: as the kernels keep them."""
    return torch.cat([w.detach() for w in weights]).to(torch.bfloat16 if bfloat16 else torch.float32).contiguous()


def bf16_products(bfloat16: bool) -> bool:
    """Whether bfloat16 weights are multiplied in bfloat16 here (CPUs with AVX-512 BF16)."""
    from ...kernels import has_bf16_products

    return bfloat16 and has_bf16_products()


def packer(bfloat16: bool, bits: int = 0):
    """pack(*weights, bias=None): the weights (rows stacked in order) as one PackedLinear, kept in bfloat16 (products
    rounding their inputs to it where the CPU has AVX-512 BF16) or float32; with bits 8 (or 4), rounded to groups
    of 32 such numbers, whose products round the activations to int8 (a quantized target's own arithmetic)."""
    from ...kernels import load

    module, bf16_dot = load(), bf16_products(bfloat16)

    def pack(*weights: torch.Tensor, bias: torch.Tensor | None = None):
        return module.PackedLinear(
            stacked(*weights, bfloat16=bfloat16),
            torch.empty(0) if bias is None else bias.detach().float(),
            bf16_dot,
            bits,
        )

    return pack


class KernelHeadLayer:
    """The kernels' view of a HeadLayer: its products packed once; `layer` as HeadLayer.layer on rows (B*T, ...)."""

    feature_dtype = torch.float32

    def __init__(self, head, bfloat16: bool, input_norm=None, bits: int = 0):
        """bfloat16: keep the weights in bfloat16 (the products' inputs are rounded to it where the CPU has
        AVX-512 BF16); otherwise float32 weights and products. bits 8 (or 4): every product's weights in groups of
        32 such numbers and its activations rounded to int8, as a quantized GGUF target's products (a quarter of
        float32's bytes a drafted token). input_norm: the RMSNorm that makes the attention's input from the
        residual stream (EAGLE), or None where the caller gives that input (EAGLE-3)."""
        self.config, self.draft_ids = head.config, head.draft_ids
        self.feature_layers = head.feature_layers
        self.embed = head.embed
        self.bits = bits
        self.pack = packer(bfloat16, bits)
        self.native = native_layer(head, bfloat16, input_norm, bits)

    def layer(self, x: torch.Tensor, h: torch.Tensor | None, shape: tuple[int, int], positions, past, mask):
        """x (B*T, H) float32, h (B*T, attention input) or None (x after the head's input norm) -> (x (B, T, H),
        (keys, values) (B, nkv, T, hd)); shape: (B, T) with B = 1 (drafting is per sequence); past and mask as
        in EagleHead.forward."""
        (B, T), c = shape, self.config
        if B != 1:
            raise ValueError("the kernels' head layer drafts one sequence at a time")
        if past is None:
            past = (torch.empty(1, c.num_kv_heads, 0, c.head_dim),) * 2
        visible = torch.empty(0, dtype=torch.bool) if mask is None else mask.reshape(T, -1)
        x, keys, values = self.native.forward(
            x, torch.empty(0) if h is None else h, positions.reshape(T), past[0][0], past[1][0], visible
        )
        return x.view(1, T, -1), (keys[None], values[None])

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """features (N, H) and tokens (N,) -> the layer's rows x (N, H) float32 and attention inputs h (N, A) or
        None (x after the head's input norm): the head's own."""
        raise NotImplementedError

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) float32 logits over the draft vocabulary: the head's own."""
        raise NotImplementedError

    def each(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, pasts: list, counts=None):
        """New pairs of several sequences in one call: features (N, H), tokens (N,), positions (N,), counts[b] rows of
        sequence b in order (None: one each); pasts: each sequence's (keys, values) (1, nkv, S_b, hd), or None for
        none. -> (outputs (N, H) float32, each sequence's (keys, values) (1, nkv, counts[b], hd)): a sequence's
        numbers are those of __call__ over its rows alone with its past (the products are batch-invariant), so
        several requests draft together what each drafts alone."""
        c = self.config
        counts = [1] * len(pasts) if counts is None else list(counts)
        empty = torch.empty(c.num_kv_heads, 0, c.head_dim)
        keys = [empty if past is None else past[0][0] for past in pasts]
        values = [empty if past is None else past[1][0] for past in pasts]
        x, h = self.inputs(features, tokens)
        x, k, v = self.native.forward_each(
            x, torch.empty(0) if h is None else h, positions.reshape(-1), keys, values, counts
        )
        starts = [sum(counts[:b]) for b in range(len(counts))]
        return x, [(k[None, :, s : s + n], v[None, :, s : s + n]) for s, n in zip(starts, counts)]

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        return features.float()


class KernelEagleHead(KernelHeadLayer):
    """An inference-only view of a trained EagleHead: (features, tokens, positions, past, mask) -> (hidden, kv)."""

    def __init__(self, head: EagleHead, bfloat16: bool = False, bits: int = 0):
        super().__init__(head, bfloat16, head.input_norm if head.config.input_norm else None, bits)
        self.fc = self.pack(head.fc.weight, bias=head.fc.bias)
        self.lm = self.pack(head.draft_lm_head)

    def __call__(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past=None, mask=None):
        """As EagleHead.forward: features (B, T, H) -> (hidden (B, T, H) float32, (keys, values) (B, nkv, T, hd))."""
        B, T, H = features.shape
        x, _ = self.inputs(features.reshape(B * T, H), tokens.reshape(B * T))
        return self.layer(x, None, (B, T), positions, past, mask)

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, None]:
        """features (N, H), tokens (N,) -> fc([embedding, feature]) (N, H) float32, and no attention input."""
        return self.fc(torch.cat([self.embed[tokens].float(), features.float()], dim=-1)), None

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) float32 logits over the draft vocabulary."""
        flat = hidden.reshape(-1, hidden.shape[-1]).float()
        return self.lm(flat).view(*hidden.shape[:-1], -1)


class KernelEagle3Head(KernelHeadLayer):
    """An inference-only view of an Eagle3Head on the kernels, as KernelEagleHead is of an EagleHead."""

    def __init__(self, head: Eagle3Head, bfloat16: bool = False, bits: int = 0):
        super().__init__(head, bfloat16, bits=bits)
        self.fc = self.pack(head.fc.weight, bias=head.fc.bias)
        self.lm = self.pack(head.lm_head.weight)
        self.norms = {name: _norm(getattr(head, name)) for name in ("hidden_norm", "input_norm", "norm")}

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """(m, A*H) layer inputs -> (m, H) float32."""
        return self.fc(features.float().contiguous())

    def __call__(self, hidden: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, past=None, mask=None):
        """As Eagle3Head.forward: hidden (B, T, H) -> (outputs (B, T, H) float32, (keys, values))."""
        B, T, H = hidden.shape
        x, both = self.inputs(hidden.reshape(B * T, H), tokens.reshape(B * T))
        return self.layer(x, both, (B, T), positions, past, mask)

    def inputs(self, hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden (N, H), tokens (N,) -> the residual rows (N, H) float32 and the attention's input (N, 2H): the
        normed embeddings beside the normed hidden states."""
        x = hidden.float().contiguous()
        both = torch.cat(
            [rms_norm(self.embed[tokens].float(), *self.norms["input_norm"]), rms_norm(x, *self.norms["hidden_norm"])],
            dim=-1,
        )
        return x, both

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) float32 logits over the draft vocabulary."""
        flat = rms_norm(hidden.reshape(-1, hidden.shape[-1]).float(), *self.norms["norm"])
        return self.lm(flat).view(*hidden.shape[:-1], -1)


def native_layer(head, bfloat16: bool, input_norm=None, bits: int = 0):
    """The head's decoder layer as one kernels call (HeadLayer in head_layer.h), weights in bfloat16 or float32 (or
    rounded to `bits` 8 or 4, as packer's); input_norm: the RMSNorm that makes the attention's input from the
    residual stream where none is given."""
    from ...kernels import load

    c = head.config

    def weight(*parts: torch.nn.Linear) -> torch.Tensor:
        return stacked(*(p.weight for p in parts), bfloat16=bfloat16)

    norm = torch.empty(0) if input_norm is None else input_norm.weight.detach().float()
    return load().HeadLayer(
        [c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size],
        float(head.post_norm.eps),
        norm,
        weight(head.q_proj, head.k_proj, head.v_proj),
        weight(head.o_proj),
        head.post_norm.weight.detach().float(),
        weight(head.gate_proj, head.up_proj),
        weight(head.down_proj),
        head.inv_freq.float(),
        bf16_products(bfloat16),
        bits,
    )


def _norm(norm) -> tuple[torch.Tensor, float]:
    """An RMSNorm as (weight (H,) float32, eps) for rms_norm."""
    return norm.weight.detach().float(), norm.eps
