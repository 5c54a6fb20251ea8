"""An EAGLE head in its authors' layout, the one vLLM's and SGLang's EAGLE-1 layers run: no RMS norm before the
attention and no fc bias (specdec trains heads from scratch with both).

A head with a norm computes attention over g * x / rms(x) for the fused input x = fc([e; f]) (B, T, H). The norm
cannot be folded into weights exactly, because rms(x) differs between positions; but over a target's own text it
varies little (for the shipped smollm2-135m head, 1.12 ± 0.09 over 13,904 answer positions), so q, k and v reading
x * g / c, with c the typical rms(x), start close to what the head computed. A short fine-tune in the new layout
(train-drafter --authors-layout --init-from HEAD) then adapts the head to the difference; `fc_input_rms` measures c
on the training data.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn as nn

from .eagle_head import EagleHead, RMSNorm


def in_authors_layout(config) -> bool:
    """Whether a head's EagleConfig is in the authors' layout: no norm before attention, no trained fc bias."""
    return not config.input_norm and not config.fc_bias


def fc_input_rms(head: EagleHead, sequences: list[dict], positions: int = 20_000) -> float:
    """The median rms over positions of the head's fused input fc([e(x_{t+1}); f_t]) on training sequences (each
    {"tokens" (L,), "features" (L-1, H)}), from at most `positions` positions in order."""
    values, seen = [], 0
    with torch.no_grad():
        for s in sequences:
            if seen >= positions:
                break
            features = s["features"][: positions - seen].float()
            tokens = s["tokens"][1 : 1 + features.shape[0]]
            x = head.fc(torch.cat([head.embed[tokens].float(), features], dim=-1))  # (n, H)
            values.append(x.pow(2).mean(-1).sqrt())
            seen += features.shape[0]
    if not values:
        raise ValueError("no training positions to measure the head's input on")
    return float(torch.cat(values).median())


def to_authors_layout(head: EagleHead, input_rms: float) -> EagleHead:
    """Turns `head` itself (and returns it) into one without the norm before attention and with a zero, untrained
    fc bias: the norm's gains over input_rms (the typical rms of fc's output, fc_input_rms) scale the columns of
    q, k and v; the bias, small beside that rms in trained heads, is dropped."""
    if input_rms <= 0:
        raise ValueError(f"input_rms must be > 0, got {input_rms}")
    with torch.no_grad():
        if isinstance(head.input_norm, RMSNorm):
            gains = head.input_norm.weight.float() / input_rms  # (H,)
            for projection in (head.q_proj, head.k_proj, head.v_proj):
                projection.weight.mul_(gains.to(projection.weight.dtype)[None, :])
        head.fc.bias.zero_()
    head.fc.bias.requires_grad_(False)
    head.input_norm = nn.Identity()
    head.config = replace(head.config, input_norm=False, fc_bias=False)
    return head
