"""Medusa heads' drafting pass on specdec's CPU kernels: each product packed once (PackedLinear), as the EAGLE head's
(eagle_kernels.py). For the single row a drafting step scores they are several times faster than torch's."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .eagle_kernels import packer
from .medusa_head import MedusaHeads


def kernel_heads_problem(heads: MedusaHeads) -> str | None:
    """Why the kernels cannot run these heads, or None (they need the hidden size in multiples of 16)."""
    from ...kernels import unavailable_reason

    size = heads.config.hidden_size
    return f"hidden size {size} not a multiple of 16" if size % 16 else unavailable_reason()


class KernelMedusaHeads:
    """An inference-only view of MedusaHeads: features (..., H) -> hidden (..., heads, H) -> logits (..., heads, K)."""

    feature_dtype = torch.float32

    def __init__(self, heads: MedusaHeads, bfloat16: bool = False):
        """bfloat16: keep the weights in bfloat16 (products round their inputs to it on CPUs with AVX-512 BF16)."""
        self.config, self.draft_ids = heads.config, heads.draft_ids
        pack = packer(bfloat16)
        layers = heads.config.num_layers
        self.blocks = [
            [pack(block.linear.weight, bias=block.linear.bias) for block in heads.blocks_of(d)]
            for d in range(len(heads.heads))
        ]
        self.shared_lm = pack(heads.draft_lm_head) if heads.draft_lm_head is not None else None
        self.own_lm = [] if self.shared_lm is not None else [pack(head[layers].weight) for head in heads.sequences]

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        flat = features.reshape(-1, features.shape[-1]).float()
        out = []
        for blocks in self.blocks:
            x = flat
            for block in blocks:
                x = x + F.silu(block(x))
            out.append(x)
        return torch.stack(out, dim=-2).view(*features.shape[:-1], len(self.blocks), -1)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., heads, H) -> (..., heads, K) float32 logits."""
        if self.shared_lm is not None:
            flat = hidden.reshape(-1, hidden.shape[-1]).float()
            return self.shared_lm(flat).view(*hidden.shape[:-1], -1)
        return torch.stack(
            [
                lm(hidden[..., d, :].reshape(-1, hidden.shape[-1]).float()).view(*hidden.shape[:-2], -1)
                for d, lm in enumerate(self.own_lm)
            ],
            dim=-2,
        )
