"""What a draft head is scored on and how: the held-out windows (a hash of each sequence's tokens picks them, so the
split stays the same as the data grows), the head's agreement with the target at each draft depth on them, and the
learning curve's plot. The trainer (trainer.py) evaluates with these at every evaluation."""

from __future__ import annotations

import random
from pathlib import Path

import torch

from ..files import write_atomic

from .batching import TrainSettings, batches, collate, is_heldout, windows
from .eagle_trainer import unrolled_losses

MAX_HELDOUT = 200  # sequences, so an evaluation stays short


def scorable(sequences: list[dict]) -> list[dict]:
    """The sequences long enough to train on or score (4 tokens or more)."""
    return [s for s in sequences if len(s["tokens"]) >= 4]


def split_heldout(sequences: list[dict], settings: TrainSettings) -> tuple[list[dict], list[dict]]:
    """(training windows, held-out windows) of the sequences: a sequence is held out by a hash of its tokens
    (`settings.holdout` of them, at most MAX_HELDOUT), so the split stays the same as the data grows and every
    head scored on one data folder is scored on the same windows."""
    seqs = scorable(sequences)
    held = [s for s in seqs if is_heldout(s, settings.holdout)]
    if not held and seqs:  # tiny data: still hold one sequence out
        held = seqs[-1:]
    held_ids = {id(s) for s in held}
    heldout = [w for s in held[:MAX_HELDOUT] for w in windows(s, settings.max_len)]
    train = [w for s in seqs if id(s) not in held_ids for w in windows(s, settings.max_len)]
    return train, heldout


def draft_vocab_index(head) -> torch.Tensor:
    """(vocab_size,) long: each target token's row in the head's draft vocabulary, -1 where it has none."""
    index = torch.full((head.config.vocab_size,), -1, dtype=torch.long)
    index[head.draft_ids] = torch.arange(len(head.draft_ids))
    return index


@torch.no_grad()
def heldout_agreement(
    head,
    heldout: list[dict],
    settings: TrainSettings,
    vocab_index: torch.Tensor | None = None,
    objective=unrolled_losses,
) -> dict:
    """Top-1 agreement with the target at each drafted depth over the held-out windows, and the chain MAT it
    implies: {"acc1": .., ..., "chain_mat": ..}."""
    head.eval()
    vocab_index = draft_vocab_index(head) if vocab_index is None else vocab_index
    hits = [0.0] * settings.steps
    total = [0.0] * settings.steps
    for group in batches(heldout, settings.batch_tokens, settings.max_len, random.Random(0)):
        _, accs = objective(head, collate(group, settings.max_len), settings, vocab_index, False)
        for i, (h, t) in enumerate(accs):
            hits[i] += h
            total[i] += t
    acc = [h / max(t, 1) for h, t in zip(hits, total)]
    mat, reach = 1.0, 1.0
    for a in acc:
        reach *= a
        mat += reach
    stats = {f"acc{i + 1}": round(a, 3) for i, a in enumerate(acc)}
    stats["chain_mat"] = round(mat, 3)
    return stats


def plot_learning_curve(history: list[dict], path: Path) -> bool:
    """Held-out agreement at each draft depth, and the chain MAT, against answer tokens seen (against optimizer
    steps for a history that did not record them: heads trained before it did); False when matplotlib (the 'bench'
    extra) is missing or there is nothing to plot."""
    if not history:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    depths = sorted(k for k in history[-1] if k.startswith("acc"))
    by_tokens = all("tokens_seen" in h for h in history)
    seen = [h["tokens_seen"] / 1e6 if by_tokens else h["step"] for h in history]
    along = "answer tokens seen (millions)" if by_tokens else "optimizer steps"
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for key in depths:
        left.plot(seen, [h[key] for h in history], marker="o", label=f"depth {key[3:]}")
    left.set(xlabel=along, ylabel="held-out top-1 agreement with the target", ylim=(0, 1))
    left.legend()
    right.plot(seen, [h["chain_mat"] for h in history], marker="o", color="k")
    right.set(xlabel=along, ylabel="chain MAT implied (held out)")
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=90))
    plt.close(fig)
    return True
