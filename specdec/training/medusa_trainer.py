"""The training objective of Medusa heads, on the same data as EAGLE heads (trainer.Trainer).

Head d at position t reads f_t and learns the target's choice at position t + d (the token x_{t+1+d}). A
position counts for head d only where the d tokens in between are the target's own choices there (the answer,
and prompt text the target would have written itself): drafting always continues the target's choices.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..drafters.heads.medusa_head import MedusaHeads
from .batching import Batch
from .eagle_trainer import draft_index


def medusa_losses(heads: MedusaHeads, batch: Batch, cfg, vocab_index: torch.Tensor, train: bool = True):
    """Cross-entropy per head (over the draft vocabulary) for one padded batch (batching.collate); with
    train=False also, per head, (hits, trials): top-1 hits among positions where every earlier head was right.
    Only positions whose target token is trainable (an answer, not prompt text) are scored."""
    tokens, features, labels, lengths = batch.tokens, batch.features, batch.labels, batch.lengths
    B, n, _ = features.shape
    f = features
    if train and cfg.feature_noise > 0:
        rms = f.pow(2).mean().sqrt()
        f = f + (torch.rand_like(f) * 2 - 1) * cfg.feature_noise * rms
    logits = heads.draft_logits(heads(f))  # (B, n, heads, K)
    pos = torch.arange(n)
    known = pos[None] < (lengths[:, None] - 1)  # (B, n): positions with a feature and a label
    follows = (tokens[:, 1:] == labels) & known  # x_{t+1} is the target's own choice at t
    chain = known.clone()  # positions whose tokens t+1..t+d-1 all follow the target
    right = torch.ones_like(known)  # every earlier head right
    losses, accs = [], []
    for d in range(1, heads.config.num_heads + 1):
        chain[:, : n - d + 1] &= follows[:, d - 1 :]
        chain[:, n - d + 1 :] = False
        lab = torch.full_like(labels, -1)
        lab[:, : n - d] = labels[:, d:]
        lab = draft_index(lab, vocab_index)
        trainable = torch.zeros_like(known)
        trainable[:, : n - d] = batch.trainable[:, d:]
        valid = chain & (lab >= 0) & trainable
        head_logits = logits[:, :, d - 1]
        ce = F.cross_entropy(
            head_logits.reshape(-1, head_logits.shape[-1]).float(), lab.reshape(-1).clamp(min=0), reduction="none"
        ).view(B, n)
        losses.append((ce * valid).sum() / valid.sum().clamp(min=1))
        if not train:
            trials = valid & right
            right = right & (head_logits.argmax(-1) == lab)
            accs.append((float((trials & right).sum()), float(trials.sum())))
    return losses, accs
