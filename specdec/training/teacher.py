"""The target's side of training-data extraction (extract.py): its choices and features on given sequences, one
prefill pass each (teacher forcing, batched within a token budget), or on its own answers to prompts (batched
plain decoding); each position summarized as its label and top-k log-probabilities."""

from __future__ import annotations

import torch

from ..sampling import tempered_logits
from .shards import TOPK


def summarize(logits: torch.Tensor, k: int = TOPK):
    """logits (T, V) -> labels (T,) int64, topk_ids (T, k) int64, topk_logprobs (T, k) float32."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, ids = logprobs.topk(k, dim=-1)
    return ids[:, 0], ids, values


def decode_batch(
    backend,
    prompts: list[list[int]],
    max_new_tokens: int,
    eos: tuple[int, ...],
    temperature: float = 0.0,
    seeds=None,
    keep_features: bool = True,
    prefill_tokens: int = 4096,
    feature_layers: tuple[int, ...] = (),
):
    """Plain batched decoding that keeps every position's hidden row and logits summary. The next token is the
    argmax (temperature 0) or drawn from softmax(logits / temperature) with one generator per sequence (`seeds`).
    Prompts are prefilled in passes of at most `prefill_tokens` padded tokens (every row's logits are kept), then
    decoded together. Yields (tokens (L,) list, hidden (L-1, C) or None, labels (L-1,), topk_ids, topk_logprobs
    (L-1, K))."""
    generators = [torch.Generator().manual_seed(s) for s in (seeds or range(len(prompts)))]

    def choose(i: int, logits: torch.Tensor) -> int:
        if temperature <= 0:
            return int(logits.argmax())
        probs = tempered_logits(logits, temperature).softmax(-1)
        return int(torch.multinomial(probs, 1, generator=generators[i]))

    caches = [backend.new_cache() for _ in prompts]
    try:
        outs = []
        for part in _token_budget_groups([len(p) for p in prompts], prefill_tokens):
            outs += backend.forward_batch(
                [caches[i] for i in part],
                [torch.tensor(prompts[i]) for i in part],
                output_hidden=keep_features,
                feature_layers=feature_layers,
            )
        tokens = [list(p) for p in prompts]
        hidden = [[o.hidden.float()] if keep_features else [] for o in outs]
        summaries = [[summarize(o.logits)] for o in outs]
        for i, o in enumerate(outs):
            tokens[i].append(choose(i, o.logits[-1]))
        steps = 1
        live = [i for i in range(len(prompts)) if tokens[i][-1] not in eos]
        while live and steps < max_new_tokens:
            outs = backend.forward_batch(
                [caches[i] for i in live],
                [torch.tensor(tokens[i][-1:]) for i in live],
                output_hidden=keep_features,
                feature_layers=feature_layers,
            )
            for i, o in zip(live, outs):
                if keep_features:
                    hidden[i].append(o.hidden.float())
                summaries[i].append(summarize(o.logits[-1:]))
                tokens[i].append(choose(i, o.logits[-1]))
            steps += 1
            live = [i for i in live if tokens[i][-1] not in eos]
        for i in range(len(prompts)):
            labels, ids, values = (torch.cat(parts) for parts in zip(*summaries[i]))
            yield tokens[i], torch.cat(hidden[i]) if keep_features else None, labels, ids, values
    finally:
        for c in caches:
            backend.release(c)


def _token_budget_groups(lengths: list[int], budget: int) -> list[list[int]]:
    """Consecutive index groups whose padded size (longest * count) stays within budget (one at least)."""
    groups: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for i, n in enumerate(lengths):
        if current and max(longest, n) * (len(current) + 1) > budget:
            groups.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, n)
    return groups + [current] if current else groups


def teacher_forced(backend, sequences: list[list[int]], feature_layers: tuple[int, ...] = ()):
    """One prefill pass over each sequence (batched). Yields (hidden (L-1, H + A*H) with the inputs of the A
    feature_layers, labels, topk_ids, topk_logprobs)."""
    caches = [backend.new_cache() for _ in sequences]
    try:
        outs = backend.forward_batch(
            caches, [torch.tensor(s) for s in sequences], output_hidden=True, feature_layers=feature_layers
        )
        for o in outs:
            yield (o.hidden[:-1].float(), *summarize(o.logits[:-1]))
    finally:
        for c in caches:
            backend.release(c)
