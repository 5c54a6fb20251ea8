"""EAGLE chains of several requests drafted together: one head pass a drafted token for all of them.

In a batch each request drafts a chain (trees are drafted alone). Drafting the chains one request at a time reads the
head's weights once a drafted token a request; on the CPU kernels the head's products are batch-invariant and its
attention reads each row's own cache (HeadLayer.forward_each), so one pass over every request's next pair gives each
the numbers, and so the chain, it would draft alone, for about the weights' bytes of one (a 16-row head pass of
smollm2's head cost 1.8 ms against 16 × 0.25 ms on a Zen 3). Greedy requests without penalties only: a sampled chain
draws from its request's own generator, a penalized one scores its own history.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import torch

from ...costs import SharedPasses, time_by_size
from ..base import Draft, DraftJob
from .eagle_device import HeadCache
from .eagle_kernels import KernelHeadLayer


class ChainDrafter(Protocol):
    """What drafting chains together reads and writes of each request's drafter (an EagleDrafter)."""

    head: Any  # a KernelHeadLayer where its chains are drafted together (EagleDrafter.pass_sharing)
    cache: HeadCache
    pair_tokens: list[int]
    draft_ids: torch.Tensor
    last_out: torch.Tensor | None

    @property
    def feat(self) -> torch.Tensor: ...

    def unseen(self, context: list[int]) -> tuple[int, list[int]]: ...

    def fed(self, want: list[int]) -> torch.Tensor: ...

    def begun(self, context: list[int]) -> None: ...


@dataclass
class _Chain:
    """One request's chain in the shared passes."""

    index: int  # its place among the jobs
    drafter: ChainDrafter
    k: int  # the most tokens it drafts
    hidden: torch.Tensor  # (H,) the head's output the next draft is scored from
    position: int  # pair position of its next drafted pair
    window: int  # head cache rows its next pair attends to (the true pairs, then this step's drafts)
    tokens: list[int] = field(default_factory=list)  # drafted so far


@torch.inference_mode()
def draft_chains_together(jobs: list[DraftJob], passes: SharedPasses) -> list[Draft]:
    """Greedy chains of up to k tokens for each job, whose drafters share one head on the kernels: the pairs each
    head cache has not seen fed in one pass (feed_together), then per depth one draft-logits product and one head
    pass (forward_each) over every chain still drafting. Each chain is the one EagleDrafter's propose drafts alone.
    `passes` learns each drafting pass's time by rows."""
    drafts: dict[int, Draft] = {}
    drafting = [(i, cast(ChainDrafter, job.drafter), job.context, job.k) for i, job in enumerate(jobs) if job.k > 0]
    drafts.update({i: Draft.empty() for i, job in enumerate(jobs) if job.k <= 0})
    roots = feed_together([(drafter, context) for _, drafter, context, _ in drafting])
    live = [
        _Chain(i, drafter, k, root, len(drafter.pair_tokens), drafter.cache.length)
        for (i, drafter, _, k), root in zip(drafting, roots)
    ]
    active = live
    while active:
        start = time.perf_counter()
        head = cast(KernelHeadLayer, active[0].drafter.head)
        scores = head.draft_logits(torch.stack([c.hidden for c in active])).float()  # (B, K)
        for chain, best in zip(active, scores.argmax(-1).tolist()):
            chain.tokens.append(int(chain.drafter.draft_ids[best]))
        going = [c for c in active if len(c.tokens) < c.k]
        if going:
            outputs, kvs = head.each(
                torch.stack([c.hidden for c in going]),
                torch.tensor([c.tokens[-1] for c in going]),
                torch.tensor([c.position + len(c.tokens) - 1 for c in going]),
                [c.drafter.cache.window(c.window) for c in going],
            )
            for chain, out, kv in zip(going, outputs, kvs):
                chain.drafter.cache.write(chain.window, kv)  # past the true pairs, as _step writes a chain's
                chain.window += 1
                chain.hidden = out
        passes.observe(len(active), time.perf_counter() - start)
        active = going
    for chain in live:
        drafts[chain.index] = Draft(tokens=torch.tensor(chain.tokens))
    return [drafts[i] for i in range(len(jobs))]


def feed_together(requests: list[tuple[ChainDrafter, list[int]]]) -> list[torch.Tensor]:
    """Each (drafter, context)'s step start (EagleDrafter.start_step), the true pairs its head has not seen fed for
    all of them in one head pass (a drafter's rows attend to its own cache): the head's output at each one's last
    pair (H,), as start_step returns it."""
    feeding = []  # (drafter, keep, want) of the drafters with pairs to feed
    wants = []
    for drafter, context in requests:
        keep, want = drafter.unseen(context)
        wants.append(want)
        if keep < len(want):
            feeding.append((drafter, keep, want))
    if feeding:
        head = cast(KernelHeadLayer, feeding[0][0].head)
        outputs, kvs = head.each(
            torch.cat([d.feat[keep : len(want)] for d, keep, want in feeding]),
            torch.tensor([token for _, keep, want in feeding for token in want[keep:]]),
            torch.tensor([p for _, keep, want in feeding for p in range(keep, len(want))]),
            [d.cache.past() for d, _, _ in feeding],
            [len(want) - keep for _, keep, want in feeding],
        )
        last = 0
        for (drafter, keep, want), kv in zip(feeding, kvs):
            drafter.cache.append(kv)
            last += len(want) - keep
            drafter.last_out = outputs[last - 1]
    roots = []
    for (drafter, context), want in zip(requests, wants):
        roots.append(drafter.fed(want))
        drafter.begun(context)
    return roots


@torch.inference_mode()
def time_head_passes(head: KernelHeadLayer, sizes=(1, 2, 4, 8, 16), repeats: int = 3) -> dict[int, float]:
    """{rows: seconds} of one shared drafting pass over that many chains (time_by_size): the draft logits and the
    head's layer over random rows, with no past (what a pass over that many sequences costs but for their
    attention); no drafter's cache is touched."""
    c = head.config
    hidden = {rows: torch.randn(rows, c.hidden_size) for rows in sizes}
    tokens = {rows: head.draft_ids[torch.randint(0, len(head.draft_ids), (rows,))] for rows in sizes}

    def shared_pass(rows: int) -> None:
        head.draft_logits(hidden[rows]).argmax(-1)
        head.each(hidden[rows], tokens[rows], torch.zeros(rows, dtype=torch.long), [None] * rows)

    return time_by_size(shared_pass, lambda _rows: None, sizes, repeats)
