"""Trains an EAGLE-style head on self-distilled data, on the CPU, within a time budget.

Each sequence gives pairs (f_t, x_{t+1}) at positions t; the head's output at t is trained towards the
target's next feature f_{t+1} (smooth L1) and the target's choice label_{t+1} (cross-entropy over the
draft vocabulary). An EAGLE-3 head reads the inputs of several target layers instead of f_t (fused by its fc)
and learns the target's choices only. Training unrolls `steps` drafting steps as in EAGLE-3's training-time test: at
step s the head reads its own step s-1 outputs as features, and its attention sees the true pairs
up to s-1 positions back plus its own chain since then, exactly what it sees when drafting.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.heads.eagle3_head import Eagle3Head
from ..drafters.heads.eagle_head import EagleHead
from .batching import Batch, TrainSettings


def unrolled_mask(n: int, steps: int, device=None) -> torch.Tensor:
    """Attention mask (steps*n, steps*n) bool over keys of all steps, positions 0..n-1 in each.

    Query of step s (1-based) at position p sees step-1 keys at positions <= p - s + 1, and the key of
    step j (2 <= j <= s) at position p - s + j only: the true context, then its own draft chain.
    """
    p = torch.arange(n, device=device)
    mask = torch.zeros(steps, n, steps, n, dtype=torch.bool, device=device)
    for s in range(1, steps + 1):
        mask[s - 1, :, 0, :] = p[None, :] <= (p[:, None] - s + 1)
        for j in range(2, s + 1):
            mask[s - 1, :, j - 1, :] = p[None, :] == (p[:, None] - s + j)
    return mask.view(steps * n, steps * n)


def unrolled_losses(
    head: EagleHead | Eagle3Head, batch: Batch, cfg: TrainSettings, vocab_index: torch.Tensor, train: bool = True
):
    """Per-step losses and, with train=False, top-1 (hits, trials) per step for one padded batch.

    Pair positions p = 0..n-1 with n = L - 2: step s feeds (its input feature at p, x_{p+1}) and is
    scored against f_{p+1} and label_{p+1}, for p >= s - 1 and p + 1 < length - 1, where label_{p+1} is
    trainable (an answer token, not prompt text).
    """
    tokens, features, lengths = batch.tokens, batch.features, batch.lengths
    B, L = tokens.shape
    n = L - 2
    pos = torch.arange(n)
    positions = pos[None].expand(B, n)
    true_f = features[:, :n]  # f_p (EAGLE-3: the inputs of its feature layers at p, fused below)
    if train and cfg.feature_noise > 0:
        rms = true_f.pow(2).mean().sqrt()
        true_f = true_f + (torch.rand_like(true_f) * 2 - 1) * cfg.feature_noise * rms
    feat_in = head.fuse(true_f)
    pair_tokens = tokens[:, 1 : n + 1]  # x_{p+1} at pair position p, the same at every step
    past, outs = None, []
    mask = unrolled_mask(n, cfg.steps)
    for s in range(1, cfg.steps + 1):
        # step s at position p continues a chain that started from the true pair at p - s + 1;
        # the head's own layer, over the keys of steps 1..s, sees exactly what it sees when drafting
        m = mask[(s - 1) * n : s * n, : s * n]
        out, kv = head(feat_in, pair_tokens, positions, past=past, mask=m | _diag_guard(m))
        past = kv if past is None else (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2))
        outs.append(out)
        # the next step, at position p + 1, reads this step's guess of f_{p+1}
        feat_in = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
    lab = draft_index(batch.labels[:, 1 : n + 1], vocab_index)
    trainable = batch.trainable[:, 1 : n + 1]
    soft = target_distribution(batch, n, vocab_index) if cfg.labels == "soft" else None
    losses, accs = [], []
    for s, out in enumerate(outs, start=1):
        shift = s - 1
        valid = (pos[None] >= shift) & (pos[None] + 1 < (lengths[:, None] - 1))
        logits = head.draft_logits(out)
        has_label = valid & (lab >= 0) & trainable
        loss = _token_loss(logits, lab, soft, has_label)
        if head.predicts_features:  # EAGLE-1/2: the output also learns the target's next feature f_{p+1}
            reg = F.smooth_l1_loss(out, features[:, 1 : n + 1], reduction="none").mean(-1)
            kept = valid & trainable
            loss = cfg.w_feature * (reg * kept).sum() / kept.sum().clamp(min=1) + cfg.w_token * loss
        losses.append(loss)
        if not train:
            hit = (logits.argmax(-1) == lab) & has_label
            accs.append((float(hit.sum()), float((valid & trainable).sum())))
    return losses, accs


def draft_index(labels: torch.Tensor, vocab_index: torch.Tensor) -> torch.Tensor:
    """Target token ids (any shape, -1: none) -> their rows in the draft vocabulary (-1: none or not in it)."""
    return torch.where(labels >= 0, vocab_index[labels.clamp(min=0)], torch.full_like(labels, -1))


def target_distribution(batch: Batch, n: int, vocab_index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's top-K distribution at positions 1..n over the draft vocabulary: (rows (B, n, K) with -1 for
    none, probabilities (B, n, K) renormalized over the rows present)."""
    rows = draft_index(batch.topk_ids[:, 1 : n + 1], vocab_index)
    probs = batch.topk_logprobs[:, 1 : n + 1].float().exp() * (rows >= 0)
    return rows, probs / probs.sum(-1, keepdim=True).clamp(min=1e-9)


def _token_loss(logits: torch.Tensor, lab: torch.Tensor, soft, has_label: torch.Tensor) -> torch.Tensor:
    """Mean over has_label (B, n) of the cross-entropy of logits (B, n, K') to the label rows lab (B, n), or to
    the soft (rows, probs) distribution."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if soft is None:
        ce = -logprobs.gather(-1, lab.clamp(min=0)[..., None])[..., 0]
    else:
        rows, probs = soft
        ce = -(logprobs.gather(-1, rows.clamp(min=0)) * probs).sum(-1)
    return (ce * has_label).sum() / has_label.sum().clamp(min=1)


def _diag_guard(mask: torch.Tensor) -> torch.Tensor:
    """Lets a query with no visible key see itself (padding rows), so that softmax never sees only -inf."""
    empty = ~mask.any(-1)
    guard = torch.zeros_like(mask)
    n = mask.shape[0]
    idx = torch.arange(n)
    guard[idx, mask.shape[1] - n + idx] = empty
    return guard
