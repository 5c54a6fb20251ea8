"""Medusa's heads on the device: one shape-static step from the last feature to each head's best candidates.

All heads read the same feature, so a Medusa draft needs one pass; what the host then needs of it is small: each
head's `width` most probable tokens and their log-probabilities. Here that pass, the log-softmax and the top-k run as
one step per width (every head is computed, the caller keeps the depth it drafts), captured as a CUDA graph on a GPU
(head_graphs.captured) and run directly on the CPU; one host read brings back the candidates, instead of every
head's logits over the draft vocabulary.
"""

from __future__ import annotations

import torch

from .head_graphs import captured


class MedusaGraphs:
    """Each head's top-`width` candidates for a feature, as a step per width, captured where `capture`."""

    def __init__(self, heads, capture: bool):
        device = heads.draft_ids.device
        if capture and device.type != "cuda":
            raise ValueError("CUDA graphs are captured on a CUDA device only")
        self.heads, self.capture = heads, capture
        self.feature = torch.zeros(heads.config.hidden_size, device=device, dtype=heads.feature_dtype)  # static input
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, tuple[torch.Tensor, ...]]] = {}
        self._memory_pool = torch.cuda.graph_pool_handle() if capture else None

    @torch.inference_mode()
    def top(self, feature: torch.Tensor, depth: int, width: int) -> tuple[list[list[float]], list[list[int]]]:
        """(log-probs, token ids), each `depth` lists of `width` (most probable first), of the first `depth` heads'
        candidates after feature (H,): the step's one host read."""
        if not self.capture:
            log_probs, ids = self._step(feature, width)
        else:
            self.feature.copy_(feature)
            if width not in self._graphs:
                self._graphs[width] = captured(lambda: self._step(self.feature, width), self._memory_pool)
            graph, (log_probs, ids) = self._graphs[width]
            graph.replay()
        values = torch.stack([log_probs[:depth].double(), ids[:depth].double()]).tolist()  # read before a replay
        return values[0], [[int(t) for t in row] for row in values[1]]

    def _step(self, feature: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(log-probs (heads, width) float32, token ids (heads, width) int64) of every head's top `width`."""
        heads = self.heads
        logits = heads.draft_logits(heads(feature[None]))[0].float()  # (heads, K)
        top = torch.topk(torch.log_softmax(logits, -1), width, dim=-1)
        return top.values, heads.draft_ids[top.indices]
