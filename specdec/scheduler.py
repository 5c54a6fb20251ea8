"""The scheduler owns each request's life: submit (the one place a Request is built: its cache and drafter), step,
cancel; a request ends in one place (BatchEngine._end). It prefills requests and runs the step every running
request takes at once.

The step: propose -> forward -> verify -> roll back -> observe. Each request with a drafter gets a draft length
(drafting.DraftLengths: from policy.py, allocated jointly from the measured cost curve so that speculation shrinks as
the batch grows; a request without one drafts nothing and the policy is not asked); its drafter proposes; one target
pass scores every request's last token and drafts (a request alone may draft a tree, scored with its mask; a batch
scores chains in one ragged pass); each request's logits are adjusted (logits.py) and verified (verify/); its KV cache
is cut back to the accepted path; and its drafter, its draft-length policy and the cost model observe what happened. A
request alone is a batch of one: SpecDecoder.generate and stream run this same step. Requests join and leave between
steps (continuous batching), each with its own KV slot (a fresh one, or a prefix restored from the prefix cache; parked
there or freed at its end), drafter and random streams. With a prefill chunk (prefill.py), a step prefills at most that
many prompt tokens while other requests run, so that a long prompt stalls nobody.
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from .choice import OWN_DRAFTER, DrafterChoice
from .config import GenerationConfig
from .speculation_config import SpeculationConfig
from .drafters.base import Drafter
from .drafter_features import observe_prompt_features, observe_step_features
from .errors import ConstraintError
from .events import StepEvent
from .costs import CostModel
from .drafting import DraftLengths, propose_all
from .prefill import Chunk, ChunkBudget, take_due
from .request import Request, close_request, open_request, pass_feature_layers
from .verify import Draft, tree_mask, verify

ENGINE_PARTS = ("prefill", "draft", "pass", "verify")  # BatchEngine.seconds: where its steps' time went


class BatchEngine:
    """Owns a set of running requests over one backend; not thread-safe (one step at a time)."""

    def __init__(
        self,
        backend,
        drafter_factory: Callable[[], Drafter | None],
        speculation: SpeculationConfig,
        costs: CostModel,
        max_batch: int = 16,
        tokenizer=None,
        tracer=None,
        learn: bool = True,
        prefill_chunk: int | str | None = None,
    ):
        """drafter_factory: the drafter of a request that takes the engine's own (OWN_DRAFTER). tokenizer: the
        target's, for text and constraints; tracer: a TraceWriter that records every request when it ends; learn:
        hand each finished output to its drafter (Drafter.learn), off for warm-up runs; prefill_chunk: the prompt
        tokens a step prefills while others run (a number, "auto" or None: whole prompts; prefill.py), on a backend
        whose chunks are exact (CausalLM.exact_chunks; elsewhere prompts are prefilled whole)."""
        self.learn = learn
        self.backend = backend
        self.tokenizer = tokenizer
        self.tracer = tracer
        self.drafter_factory = drafter_factory
        self.speculation = speculation
        self.costs = costs
        self.max_batch = max_batch
        self.waiting: list[tuple[object, Request]] = []  # admitted, not yet (wholly) prefilled
        self.chunks = ChunkBudget(prefill_chunk) if prefill_chunk is not None and backend.exact_chunks else None
        self.running: dict[object, Request] = {}
        self.draft_lengths = DraftLengths(costs, speculation.max_batch_for_drafting)
        self.seconds = dict.fromkeys(ENGINE_PARTS, 0.0)  # cumulative: prefill passes, drafting, the step's target
        # pass, and verification (sampling, cache rollback, what the drafters and policies observe)

    def __len__(self) -> int:
        return len(self.waiting) + len(self.running)

    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self)

    def submit(
        self,
        request_id,
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: DrafterChoice = OWN_DRAFTER,
        speculation: SpeculationConfig | None = None,
    ) -> Request:
        """Admits a request (the one place a Request is built): it takes its cache and drafter now, is prefilled at
        the next step, and ends when a step finishes it or cancel(request_id) drops it; its events carry request_id.
        Returns its state, to read. drafter: the engine's own, none (PLAIN) or a given one; speculation: default the
        engine's. Raises if the batch is full."""
        if self.free_slots <= 0:
            raise RuntimeError("the batch is full")
        made = self.drafter_factory() if drafter.own else drafter.drafter
        request = Request(
            prompt_ids,
            config,
            self.backend.info,
            made,
            speculation or self.speculation,
            self.costs,
            learn=self.learn,
            tokenizer=self.tokenizer,
            tracer=self.tracer,
        )
        open_request(self.backend, request)
        self.waiting.append((request_id, request))
        return request

    def cancel(self, request_id) -> None:
        """Drops a request at once and frees its slot; nothing happens for one that already ended."""
        self._end(request_id, "cancelled")

    def _end(self, request_id, reason: str) -> None:
        """The one place a request ends: it leaves the batch and is closed (close_request)."""
        waiting = [i for i, (rid, _) in enumerate(self.waiting) if rid == request_id]
        request = self.waiting.pop(waiting[0])[1] if waiting else self.running.pop(request_id, None)
        if request is not None:
            close_request(self.backend, request, reason)

    # ---- the step ---------------------------------------------------------------------------------
    def step(self) -> list[StepEvent]:
        """Prefills newcomers, and runs one step for every request that was running before them: a step reports
        each request once (a newcomer's first decoding step is the next one)."""
        ready = list(self.running.items())
        events = self._prefill(others_running=bool(ready))
        if not ready:
            return events
        ids, requests = [rid for rid, _ in ready], [r for _, r in ready]
        solo = len(requests) == 1  # alone, a request may draft a tree (the batched pass scores chains only)
        t0 = time.perf_counter()
        drafting = any(r.drafter is not None for r in requests)
        lengths = self.draft_lengths.plan(requests, solo) if drafting else [0] * len(requests)
        drafts = propose_all(requests, lengths, solo) if any(lengths) else [Draft.empty()] * len(requests)
        self.seconds["draft"] += time.perf_counter() - t0
        inputs = [torch.tensor([r.tokens[-1]] + d.tokens.tolist()) for r, d in zip(requests, drafts)]  # (1 + k,)
        layers = pass_feature_layers(requests)
        wanted = dict(
            output_hidden=layers is not None,
            feature_layers=layers or (),
            argmax_only=all(r.argmax_only for r in requests),
        )
        t0 = time.perf_counter()
        if solo:
            mask = tree_mask(drafts[0].parents) if drafts[0].parents is not None else None  # (1 + k, 1 + k)
            outputs = [self.backend.forward(requests[0].cache, inputs[0], tree_mask=mask, **wanted)]
        else:
            outputs = self.backend.forward_batch([r.cache for r in requests], inputs, **wanted)
        seconds = time.perf_counter() - t0
        self.seconds["pass"] += seconds
        if self.chunks is not None:
            self.chunks.observe_step(seconds)
        if any(r.drafter is not None for r in requests):  # the cost curve serves draft lengths only
            self.costs.observe_verify(sum(len(x) for x in inputs), seconds, sequences=len(inputs))
        t1 = time.perf_counter()
        events += [
            self._outcome(rid, r, self._verify, r, draft, out.logits, out.hidden, layers, seconds)
            for rid, r, draft, out in zip(ids, requests, drafts, outputs)
        ]
        self.seconds["verify"] += time.perf_counter() - t1
        return events

    def _verify(
        self,
        request: Request,
        draft: Draft,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        layers: tuple[int, ...] | None,
        seconds: float,
    ) -> list[int]:
        """Verifies the target's logits (1 + k, V) of a request's scored rows, rolls its cache back to the accepted
        path (a chain's cache is truncated, a tree's compacted), lets its drafter (hidden (1 + k, H + A*H) for the
        pass's feature `layers`) and policy observe, and hands the outcome to the request: the tokens it emitted."""
        processed = request.logits_processor.rows(logits, draft) if request.logits_processor is not None else logits
        path, token = verify(
            draft, processed, request.config.sampling, request.generator, request.noise_ahead(), request.acceptance
        )
        rows = [0] + [i + 1 for i in path]
        if draft.parents is not None:
            self.backend.compact(request.cache, len(request.tokens) - 1, rows)
        else:
            self.backend.truncate(request.cache, len(request.tokens) + len(path))
        drafter = request.drafter
        if request.needs_scores and drafter is not None:  # every row's choice, rejected drafts included
            drafter.scored(draft, processed.argmax(-1).cpu(), path)
        if request.needs_features:
            observe_step_features(request, hidden, rows, layers)
        if request.policy is not None:
            request.policy.observe(len(draft), len(path), draft.positions)
        return request.take_step(draft, path, token, logits, processed, seconds)

    # ---- prefill ----------------------------------------------------------------------------------
    def _prefill(self, others_running: bool) -> list[StepEvent]:
        """Prefills the waiting requests, or with a chunk budget and others running, those that fit it (and a chunk
        of the next, in the same pass); each request whose prefill ends gets its first token and joins the running
        batch."""
        if not self.waiting:
            return []
        batch, chunk = self._prompts_due(others_running)
        events = []
        copies = self.backend.copies_caches
        for every_row in (False, True):  # requests that want prompt logprobs get every row's logits, in a pass apart
            groups: dict = {}  # the same prompt (n choices, repeated requests) is prefilled once, then copied
            for i, (rid, r) in enumerate(batch):
                if r.prefill_all_logits == every_row:
                    same = (tuple(r.tokens), r.cache.length) if copies else i
                    groups.setdefault(same, []).append((rid, r))
            if not groups:
                continue
            leads = [members[0][1] for members in groups.values()]
            rider, chunk = (chunk, None) if not every_row else (None, chunk)  # it rides in the first pass
            riding = [rider.request] if rider is not None else []
            layers = pass_feature_layers([r for members in groups.values() for _, r in members] + riding)
            inputs = [torch.tensor(r.tokens[r.cache.length :]) for r in leads]
            caches = [r.cache for r in leads]  # after the prefix the cache restored
            if rider is not None:
                rider.join(caches, inputs)
            t0 = time.perf_counter()
            outputs = self.backend.forward_batch(
                caches,
                inputs,
                output_hidden=layers is not None,
                feature_layers=layers or (),
                last_only=not every_row,
                argmax_only=all(r.argmax_only for m in groups.values() for _, r in m),
            )
            seconds = time.perf_counter() - t0
            if rider is not None:  # its output is the last
                rider.prefilled(outputs[-1].hidden, layers)
            self._prefilled(sum(len(x) for x in inputs), seconds)
            for members, lead, out in zip(groups.values(), leads, outputs):
                for _, request in members[1:]:  # before any starts: a lead that ends at once frees its cache
                    self.backend.copy_cache(lead.cache, request.cache)
                for rid, request in members:
                    self.running[rid] = request
                    events.append(
                        self._outcome(rid, request, self._first_token, request, out.logits, out.hidden, layers, seconds)
                    )
        if chunk is not None:  # no whole prompt's pass to join
            self._prefilled(chunk.size, chunk.prefill_alone(self.backend))
        return events

    def _prompts_due(self, others_running: bool) -> tuple[list[tuple[object, Request]], Chunk | None]:
        """The waiting requests whose prefill ends this step, taken out of `waiting`, and the chunk of the next one in
        line if it is to be prefilled in part, or None."""
        if self.chunks is None or not others_running:  # whole prompts: nobody would wait for them
            batch, self.waiting = self.waiting, []
            return batch, None
        batch, self.waiting, chunk = take_due(self.waiting, self.chunks, len(self.running))
        return batch, chunk

    def _prefilled(self, tokens: int, seconds: float) -> None:
        """Counts a prefill pass of `tokens` prompt tokens (whole prompts and chunks) in its time and auto's costs."""
        self.seconds["prefill"] += seconds
        if self.chunks is not None:
            self.chunks.observe_prefill(tokens, seconds)

    def _first_token(
        self,
        request: Request,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        layers: tuple[int, ...] | None,
        seconds: float,
    ) -> list[int]:
        """Chooses a request's first token from its prefill's logits, (1, V) for the last prompt token or (prompt
        length, V) when it asked for prompt logprobs; hidden: the prompt's rows (prompt length, H + A*H) for the
        pass's feature `layers`, for drafters that read features."""
        if request.prefill_all_logits:
            request.take_prompt_logprobs(logits)
        last = logits[-1:]
        if request.needs_features:
            observe_prompt_features(request, hidden, layers)
        draft = Draft.empty()
        processed = request.logits_processor.rows(last, draft) if request.logits_processor is not None else last
        _, token = verify(draft, processed, request.config.sampling, request.generator, request.noise_ahead())
        return request.take_first(token, last, processed, seconds)

    def _outcome(self, rid, request: Request, take: Callable[..., list[int]], *args) -> StepEvent:
        """The step's event for one request, whose new tokens take(*args) chooses; a ConstraintError there ends
        that request alone (finished "error"), never the batch."""
        try:
            return self._event(rid, request, take(*args))
        except ConstraintError as exc:
            request.finished = "error"
            return self._event(rid, request, [], str(exc))

    def _event(self, rid, request: Request, new: list[int], error: str = "") -> StepEvent:
        if request.finished:
            self._end(rid, request.finished)
        return StepEvent(request_id=rid, new_tokens=new, finished=request.finished, state=request, error=error)
