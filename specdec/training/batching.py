"""Training batches from stored sequences: windows, the held-out split, length-grouped batches, padding."""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 3  # drafting steps unrolled per position
    lr: float = 1e-3
    warmup: int = 50
    decay_from: float = 0.8  # the learning rate is flat until this share of the planned steps, then decays
    batch_tokens: int = 4096
    max_len: int = 512  # longest window of a sequence in one batch row (longer sequences are split)
    feature_noise: float = 0.05  # uniform noise on input features, as in EAGLE, relative to their RMS
    w_feature: float = 1.0
    w_token: float = 0.1
    step_decay: float = 0.8  # weight of unrolled step s is step_decay ** (s - 1)
    holdout: float = 0.03
    labels: str = "top1"  # top1: cross-entropy to the target's choice; soft: to its top-K distribution
    seed: int = 0


@dataclass
class Batch:
    """Padded tensors: tokens (B, L); features (B, L-1, C); labels, trainable (B, L-1) (label -1: none);
    topk_ids, topk_logprobs (B, L-1, K) (ids -1: none); lengths (B,)."""

    tokens: torch.Tensor
    features: torch.Tensor
    labels: torch.Tensor
    lengths: torch.Tensor
    trainable: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor


def choose_draft_vocab(
    sequences: list[dict],
    size: int,
    vocab_size: int,
    given: torch.Tensor | None = None,
    prior: torch.Tensor | None = None,
) -> tuple[torch.Tensor, float]:
    """The `size` most frequent target choices at trained positions (or the `given` ids): (token ids ascending,
    share of those labels covered). prior: ids to prefer among tokens the data counts equally (a head being
    fine-tuned keeps its own vocabulary where little data says nothing: a token seen once still comes first)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for seq in sequences:
        labels = seq["labels"][seq["trainable"]] if "trainable" in seq else seq["labels"]
        counts += torch.bincount(labels, minlength=vocab_size)
    score = counts.double()
    if prior is not None:
        score[prior.long()] += 0.5
    top = torch.topk(score, min(size, vocab_size)).indices.sort().values if given is None else given.long()
    return top, float(counts[top].sum() / counts.sum().clamp(min=1))


def is_heldout(seq: dict, share: float) -> bool:
    """A fixed choice per sequence (a hash of its tokens), so the held-out set stays the same as data grows."""
    return zlib.crc32(seq["tokens"][:64].to(torch.int32).numpy().tobytes()) % 10_000 < share * 10_000


def windows(seq: dict, max_len: int) -> list[dict]:
    """The sequence, or windows of at most max_len tokens, of even sizes, overlapping by one token (every scored
    position once), dropping windows with nothing to learn."""
    L = len(seq["tokens"])
    if L <= max_len:
        return [seq]
    scored = L - 1
    count = -(-scored // (max_len - 1))
    bounds = [round(i * scored / count) for i in range(count + 1)]
    out = []
    for start, stop in zip(bounds, bounds[1:]):  # scored positions start..stop-1, tokens start..stop
        part = {
            k: (v[start : stop + 1] if k == "tokens" else v[start:stop]) if torch.is_tensor(v) else v
            for k, v in seq.items()
        }
        if bool(part["trainable"].any()):
            out.append(part)
    return out


def batches(sequences: list[dict], batch_tokens: int, max_len: int, rng: random.Random) -> list[list[dict]]:
    """Groups sequences of similar length into batches of about batch_tokens padded tokens, in shuffled order."""
    order = sorted(sequences, key=lambda s: min(len(s["tokens"]), max_len))
    out: list[list[dict]] = []
    cur: list[dict] = []
    for seq in order:
        longest = min(len(seq["tokens"]), max_len)  # sorted by length: the newcomer is the longest
        if cur and longest * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(seq)
    if cur:
        out.append(cur)
    rng.shuffle(out)
    return out


def collate(group: list[dict], max_len: int) -> Batch:
    """Pads a group (each sequence cut to max_len) into a Batch."""
    L = max(min(len(s["tokens"]), max_len) for s in group)
    C = group[0]["features"].shape[-1]
    K = group[0]["topk_ids"].shape[-1] if "topk_ids" in group[0] else 1
    B = len(group)
    batch = Batch(
        tokens=torch.zeros(B, L, dtype=torch.long),
        features=torch.zeros(B, L - 1, C),
        labels=torch.full((B, L - 1), -1, dtype=torch.long),
        lengths=torch.zeros(B, dtype=torch.long),
        trainable=torch.zeros(B, L - 1, dtype=torch.bool),
        topk_ids=torch.full((B, L - 1, K), -1, dtype=torch.long),
        topk_logprobs=torch.zeros(B, L - 1, K),
    )
    for b, s in enumerate(group):
        n = min(len(s["tokens"]), max_len)
        batch.tokens[b, :n] = s["tokens"][:n]
        batch.features[b, : n - 1] = s["features"][: n - 1].float()
        batch.labels[b, : n - 1] = s["labels"][: n - 1]
        batch.trainable[b, : n - 1] = s["trainable"][: n - 1] if "trainable" in s else True
        if "topk_ids" in s:
            batch.topk_ids[b, : n - 1] = s["topk_ids"][: n - 1]
            batch.topk_logprobs[b, : n - 1] = s["topk_logprobs"][: n - 1].float()
        else:
            batch.topk_ids[b, : n - 1, 0] = s["labels"][: n - 1]
        batch.lengths[b] = n
    return batch
