"""Pipelined EAGLE chains: drafting the next step while the target verifies this one (an experiment, bench only).

PEARL's post-verify (Liu et al. 2024, "Parallel Speculative Decoding with Adaptive Draft Length"): once a chain
d_1..d_k is proposed, a worker thread keeps drafting while the target scores it, as if all k were accepted and the
bonus token were the head's own next guess g: it drafts g, then the k tokens after it, e_1..e_k, each fed to the head
with the head's own output as its feature (as a chain's later tokens always are). If the next step's context is
exactly context + d_1..d_k + g, that step's draft is e_1..e_k, ready: its drafting time was hidden behind the verify
pass. Otherwise the work is dropped and the step drafts as usual. The work is used only through the context it was
drafted for, and every drafted token is verified by the target: output stays the target's (lossless).

Concurrency: on a CPU the worker is a thread, and for the overlap window (proposal to observe: the target's forward
and verification) the main thread and the worker each run torch with `threads` intra-op threads (OpenMP's thread
count is per thread); the main thread's count is restored afterwards. On CUDA the worker would draft on a side
stream that the main stream waits for at the join (written, not measured: no GPU was available).

Only greedy requests without penalties are pipelined (a sampling request's draws would be taken out of order);
others are drafted by the wrapped drafter unchanged. docs/experiments/overlap.md records whether this pays (on a 2-core CPU: it
does not), which is why it is not a registered drafter.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from specdec.drafters.base import Budget, Draft, Drafter, DraftRequest
from specdec.drafters.eagle import EagleDrafter

# (h, kv, position, pending): the head's output h (H,) at its last fed pair, its keys/values kv ((1, nkv, S, hd) x 2),
# the pair position of the next pair to feed, and the last drafted token not yet fed (None: none)
HeadState = tuple


@dataclass
class Ahead:
    """Work drafted during a verify pass: usable only where the next step's context is `expected`."""

    expected: list[int]  # context + draft + the head's guess of the bonus token
    tokens: list[int]  # the chain drafted after that context, e_1..e_n
    states: list[HeadState]  # states[j]: the head's state after drafting tokens[: j + 1]
    event: object = None  # CUDA: the side stream's event the main stream waits for


class PipelinedChain(Drafter):
    """Wraps an EagleDrafter drafting chains; see the module docstring. hits / launched count the steps whose draft
    came from the worker and the verify passes it drafted behind."""

    feature_layers = ()  # the final hidden state

    def __init__(self, inner: EagleDrafter, threads: int = 1):
        if inner.tree:
            raise ValueError("PipelinedChain pipelines chains: give it an EagleDrafter with tree=False")
        self.inner = inner
        self.name = f"{inner.name}-pipelined"  # costs are kept per name: its drafting time is not eagle's
        self.threads = threads
        self.hits = self.launched = 0
        self._pool: ThreadPoolExecutor | None = None
        self._future: Future | None = None
        self._ahead: Ahead | None = None
        self._main_threads: int | None = None  # the main thread's torch threads while a worker drafts (CPU)
        self._stream = None  # CUDA: the side stream the worker drafts on

    def fork(self) -> "PipelinedChain":
        return PipelinedChain(self.inner.fork(), self.threads)

    # ---- the contract: every call first waits for the worker (it reads the head's state) --------------------
    def begin(self, request: DraftRequest) -> None:
        self._join()
        self._ahead = None
        super().begin(request)
        self.inner.begin(request)

    def observe(self, features: torch.Tensor) -> None:
        self._join()
        self.inner.observe(features)

    def end(self) -> None:
        self._join()
        self._ahead = None
        self.inner.end()

    def close(self) -> None:
        """Stops the worker thread."""
        self._join()
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None

    @torch.inference_mode()
    def propose(self, context: list[int], budget: Budget) -> Draft:
        self._join()
        ahead, self._ahead = self._ahead, None
        sampling = self.inner.request.sampling
        if budget.k <= 0 or not sampling.greedy or sampling.penalized:
            return self.inner.propose(context, budget)
        k = budget.k
        if ahead is not None and ahead.expected == context and ahead.tokens:
            self.hits += 1
            n = min(k, len(ahead.tokens))
            tokens, state = ahead.tokens[:n], ahead.states[n - 1]
            if n < k:  # the policy asks for more than was drafted ahead: the rest now
                more, state = self._draft(state, k - n)
                tokens = tokens + more
        else:
            inner = self.inner
            root = inner._sync(context)  # the head's output at the last true pair (H,)
            tokens, state = self._draft((root, inner.kv, len(inner.pair_tokens), None), k)
        self._launch(context + tokens, state, k)
        return Draft(tokens=torch.tensor(tokens))

    # ---- drafting -------------------------------------------------------------------------------------------
    def _draft(self, state: HeadState, n: int, states: list | None = None) -> tuple[list[int], HeadState]:
        """n greedy chain tokens from `state` (EagleDrafter._chain's, for greedy requests without penalties); the
        state after each is appended to `states` where given."""
        inner, (h, kv, position, pending) = self.inner, state
        tokens = []
        for _ in range(n):
            if pending is not None:  # the pair (h, last token): the head's guess of that token's feature
                out, kv = inner._step(h[None], [pending], [position], kv)
                h, position = out[0], position + 1
            logits = inner.head.draft_logits(h[None]).float()[0]  # (K,) over the draft vocabulary
            pending = int(inner.head.draft_ids[int(logits.argmax())])
            tokens.append(pending)
            if states is not None:
                states.append((h, kv, position, pending))
        return tokens, (h, kv, position, pending)

    def _ahead_of(self, drafted: list[int], state: HeadState, k: int, stream) -> Ahead:
        """In the worker: the head's guess g of the bonus token after `drafted` (context + draft), then k tokens."""
        with torch.inference_mode(), (torch.cuda.stream(stream) if stream is not None else nullcontext()):
            (guess,), state = self._draft(state, 1)
            states: list[HeadState] = []
            tokens, _ = self._draft(state, k, states)
            event = None
            if stream is not None:
                event = torch.cuda.Event()
                event.record(stream)
        return Ahead(expected=drafted + [guess], tokens=tokens, states=states, event=event)

    # ---- the worker -----------------------------------------------------------------------------------------
    def _launch(self, drafted: list[int], state: HeadState, k: int) -> None:
        device = state[0].device
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="specdec-draft-ahead",
                                            initializer=torch.set_num_threads, initargs=(self.threads,))
        stream = self._stream = self._stream or side_stream(device)
        if stream is not None:  # the side stream starts after the main stream's work that made `state`
            stream.wait_stream(torch.cuda.current_stream(device))
        if device.type == "cpu":  # the cores are shared out for the window: the target gets `threads` of them
            self._main_threads = torch.get_num_threads()
            torch.set_num_threads(self.threads)
        self.launched += 1
        self._future = self._pool.submit(self._ahead_of, drafted, state, k, stream)

    def _join(self) -> None:
        if self._future is None:
            return
        future, self._future = self._future, None
        try:
            self._ahead = future.result()
        finally:
            if self._main_threads is not None:
                torch.set_num_threads(self._main_threads)
                self._main_threads = None
        if self._ahead.event is not None:
            torch.cuda.current_stream().wait_event(self._ahead.event)


def side_stream(device: torch.device):
    """A CUDA stream apart from the current one for drafting on `device`; None elsewhere (a CPU has no streams)."""
    return torch.cuda.Stream(device) if device.type == "cuda" else None
