"""Batched speculative decoding: many sequences share each target pass.

Sequences join and leave between steps (continuous batching). Each keeps its own KV slot, drafter
and random streams; one step drafts for every running sequence, scores all of them in one ragged
target pass (masks and positions per sequence), and verifies each on its own. Draft lengths are
allocated jointly from the measured cost curve, so speculation shrinks as the batch grows; above
SpeculationConfig.max_batch_for_drafting sequences a step drafts nothing at all (no probes either).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .adaptive import CostModel, choose_lengths, draft_length
from .config import GenerationConfig, SpeculationConfig
from .drafters.base import Drafter
from .sequence import SequenceState


@dataclass
class StepEvent:
    """What one step did for one sequence."""

    request_id: object
    new_tokens: list[int]
    finished: str = ""  # "", "stop" or "length"
    state: SequenceState | None = field(default=None, repr=False)


class BatchEngine:
    """Owns a set of running sequences over one backend; not thread-safe (one step at a time)."""

    def __init__(self, backend, drafter_factory: Callable[[], Drafter | None], speculation: SpeculationConfig,
                 costs: CostModel, max_batch: int = 16, tokenizer=None, tracer=None):
        """tokenizer: the target's, for requests with a structured-output constraint; tracer: a TraceWriter that
        records every request when it ends."""
        self.backend = backend
        self.tokenizer = tokenizer
        self.tracer = tracer
        self.drafter_factory = drafter_factory
        self.speculation = speculation
        self.costs = costs
        self.max_batch = max_batch
        self.waiting: list[tuple[object, SequenceState]] = []  # admitted, not yet prefilled
        self.running: dict[object, SequenceState] = {}

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self)

    def add(self, request_id, prompt_ids: list[int], config: GenerationConfig,
            speculation: SpeculationConfig | None = None, drafter: Drafter | None | str = "default") -> SequenceState:
        """Admits a request; it is prefilled at the next step. Raises if the batch is full."""
        if self.free_slots <= 0:
            raise RuntimeError("the batch is full")
        made = self.drafter_factory() if drafter == "default" else drafter
        state = SequenceState(prompt_ids, config, self.backend, made, speculation or self.speculation, self.costs,
                              allow_tree=False, tokenizer=self.tokenizer,
                              tracer=self.tracer)  # trees: once it runs alone (see step)
        return self.admit(request_id, state)

    def admit(self, request_id, state: SequenceState) -> SequenceState:
        """Admits a request's state made elsewhere (SpecDecoder.start); it is prefilled at the next step."""
        if self.free_slots <= 0:
            raise RuntimeError("the batch is full")
        self.waiting.append((request_id, state))
        return state

    def cancel(self, request_id) -> None:
        """Drops a request at once and frees its slot."""
        for i, (rid, state) in enumerate(self.waiting):
            if rid == request_id:
                state.close("cancelled")
                del self.waiting[i]
                return
        state = self.running.pop(request_id, None)
        if state is not None:
            state.close("cancelled")

    def step(self) -> list[StepEvent]:
        """Prefills newcomers, and runs one speculative step for every sequence that was running before them: a
        step reports each sequence once (a newcomer's first decoding step is the next one)."""
        ready = list(self.running.items())
        events = self._prefill()
        if not ready:
            return events
        ids, states = [rid for rid, _ in ready], [s for _, s in ready]
        solo = len(states) == 1  # alone, a sequence may draft a tree (the batched pass scores chains only)
        for s in states:
            _allow_tree(s, solo)
        if self._drafting_off(len(states)):
            ks = [0] * len(states)  # plain decoding: no drafter runs, no policy probes or counts down its pause
        elif solo:
            ks = [draft_length(states[0], self.costs)]
        else:
            ks = choose_lengths([s.policy for s in states], self.costs, [s.draft_cap() for s in states])
        drafts = [s.propose(k) for s, k in zip(states, ks)]
        inputs = [s.step_ids(d) for s, d in zip(states, drafts)]
        t0 = time.perf_counter()
        if solo:
            outputs = [self.backend.forward(states[0].cache, inputs[0], tree_mask=states[0].step_mask(drafts[0]),
                                            output_hidden=states[0].needs_features)]
        else:
            outputs = self.backend.forward_batch([s.cache for s in states], inputs,
                                                 output_hidden=any(s.needs_features for s in states))
        seconds = time.perf_counter() - t0
        self.costs.observe_verify(sum(len(x) for x in inputs), seconds)
        for rid, state, draft, out in zip(ids, states, drafts, outputs):
            new = state.finish_step(draft, out.logits, seconds, out.hidden)
            events.append(self._event(rid, state, new))
        return events

    def _drafting_off(self, batch_size: int) -> bool:
        """Whether a step verifying `batch_size` sequences is over the engine's limit for drafting (the engine's
        SpeculationConfig decides it, not a request's own)."""
        limit = self.speculation.max_batch_for_drafting
        return limit is not None and batch_size > limit

    def _prefill(self) -> list[StepEvent]:
        if not self.waiting:
            return []
        batch, self.waiting = self.waiting, []
        events = []
        copy = getattr(self.backend, "copy_cache", None)
        for every_row in (False, True):  # requests that want prompt logprobs get every row's logits, in a pass apart
            groups: dict = {}  # the same prompt (n choices, repeated requests) is prefilled once, then copied
            for i, (rid, s) in enumerate(batch):
                if s.prefill_all_logits == every_row:
                    groups.setdefault(tuple(s.tokens) if copy else i, []).append((rid, s))
            if not groups:
                continue
            leads = [members[0][1] for members in groups.values()]
            t0 = time.perf_counter()
            outputs = self.backend.forward_batch([s.cache for s in leads], [s.prefill_ids() for s in leads],
                                                 output_hidden=any(s.needs_features for members in groups.values()
                                                                   for _, s in members),
                                                 last_only=not every_row)
            seconds = time.perf_counter() - t0
            for members, lead, out in zip(groups.values(), leads, outputs):
                for _, state in members[1:]:  # before any starts: a lead that ends at once frees its cache
                    copy(lead.cache, state.cache)
                for rid, state in members:
                    new = state.start(out.logits, seconds, out.hidden)
                    self.running[rid] = state
                    events.append(self._event(rid, state, new))
        return events

    def _event(self, rid, state: SequenceState, new: list[int]) -> StepEvent:
        if state.finished:
            self.running.pop(rid, None)
            state.close()
        return StepEvent(request_id=rid, new_tokens=new, finished=state.finished, state=state)


def _allow_tree(state: SequenceState, allowed: bool) -> None:
    """Lets a tree-drafting drafter draft trees in this step, or chains only."""
    request = getattr(state.drafter, "request", None)
    if request is not None:
        request.allow_tree = allowed
