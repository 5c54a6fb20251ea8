"""The API: `SpecDecoder` loads a target and a drafter once, then generates, streams or batches many prompts.

Every call is a thin wrapper over the scheduler (scheduler.py), which owns each request's life: submit, step,
cancel; a request alone is a batch of one. With PLAIN for its drafter (choice.py) the same step is plain
autoregressive decoding (the baseline), so both run the same code. Text comes out of one stream core (TextSteps,
stream_core.py): generate, stream, generate_many and the server all read it.
"""

from __future__ import annotations

import gc

from .choice import OWN_DRAFTER, PLAIN, DrafterChoice
from .config import GenerationConfig
from .speculation_config import SpeculationConfig
from .drafters.base import Drafter
from .errors import ConfigError, ConstraintError
from .metrics import GenerationMetrics
from .costs import CostModel, measure_verify_costs
from .loader import load_decoder, warm_up_drafter
from .request import Request
from .scheduler import BatchEngine
from .stream_core import GenerationResult, TextSteps, TextStream


class SpecDecoder:
    """Speculative decoding over one target model and one drafter: lossless, unless its SpeculationConfig asks for
    a lossy acceptance rule (config.Acceptance)."""

    warmed_up = False  # after warm_up(): drafters built later by name are warmed up too
    tracer = None  # a TraceWriter (specdec/trace.py) recording every request, after trace_to()

    def __init__(
        self,
        target,
        drafter: Drafter | None = None,
        speculation: SpeculationConfig | None = None,
        chat: bool = True,
        costs: CostModel | None = None,
    ):
        self.target = target  # LoadedModel
        self.drafter = drafter
        self.speculation = speculation or SpeculationConfig()
        self.chat = chat
        self.costs = costs or CostModel()
        self.drafter_options: dict = {}  # create_drafter's options for drafters that calls pick by name
        self._named_drafters: dict[tuple, Drafter | None] = {}  # by (name, options); None: plain decoding

    load = classmethod(load_decoder)  # SpecDecoder.load(model, drafter=..., ...): the one loader (loader.py)

    def warm_up(self, max_new_tokens: int = 16, drafter: Drafter | None = None) -> None:
        """Runs a short generation twice with drafting forced on, so that the draft-length policy starts from a warm
        drafting cost (loader.warm_up_drafter). drafter: default this decoder's own; drafters built later by name
        (drafter_named) are warmed up in turn."""
        self.warmed_up = True
        warm_up_drafter(self, drafter or self.drafter, max_new_tokens)

    @property
    def target(self):
        """The target (LoadedModel); a ConfigError once close() released it."""
        if self._target is None:
            raise ConfigError("this SpecDecoder was closed")
        return self._target

    @target.setter
    def target(self, target) -> None:
        self._target = target

    def close(self) -> None:
        """Releases the target, the drafters and their KV caches: their memory goes back once nothing else holds
        them (a result's tensors, a stream). The decoder is unusable after; closing twice does nothing. The kernels'
        OpenMP threads belong to the process and stay. `with SpecDecoder.load(...) as decoder:` closes on leaving."""
        if self._target is None:
            return
        self._target.backend.enable_prefix_cache(0)  # its parked caches go with it
        if self.tracer is not None:
            self.tracer.close()
        self.tracer, self.drafter, self._target = None, None, None
        self._named_drafters.clear()
        gc.collect()  # drafters and caches refer to the target in cycles

    def __enter__(self) -> "SpecDecoder":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def enable_prefix_cache(self, max_entries: int = 16) -> bool:
        """Keeps up to `max_entries` finished sequences' KV caches, so that prompts beginning as an earlier one
        (a system prompt, a chat's earlier turns) skip that part of their prefill; 0 turns it off. False where
        nothing is cached (a backend without cache slots: transformers' forward)."""
        return self.target.backend.enable_prefix_cache(max_entries)

    def trace_to(self, path) -> None:
        """Appends an acceptance trace of every later request to `path` (JSONL: prompt and output token ids, and
        each step's drafted and accepted counts), for `specdec replay`; engines made before keep theirs."""
        from .trace import TraceWriter

        if not self.costs.measured:  # plain decoding loads without timing the target: replays need its costs
            self.costs = CostModel(measure_verify_costs(self.target.backend))
        self.tracer = TraceWriter(path, self.target.name, self.costs.table)

    # ---- prompts ------------------------------------------------------------------------------
    def encode(self, prompt, tools: list[dict] | None = None) -> list[int]:
        """Token ids for a prompt: a string (through the chat template when chat is on), messages, or ids.
        tools: function definitions (OpenAI's format) for a chat template that takes them."""
        tokenizer = self.target.tokenizer
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, str) and not (self.chat and tokenizer.chat_template):
            return tokenizer(prompt, add_special_tokens=True)["input_ids"]
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if not tokenizer.chat_template:
            raise ConfigError("this model's tokenizer has no chat template; pass a plain string with chat off")
        extra = {"tools": tools} if tools else {}
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    # ---- drafters by name ---------------------------------------------------------------------
    def drafter_named(self, name: str, **options) -> Drafter | None:
        """The drafter called `name` (None for "none"): this decoder's own, or one built for this target with
        `options` (default: the decoder's drafter_options) on first use and kept. Callers running requests side by
        side fork it."""
        if name == "none":
            return None
        if self.drafter is not None and name == self.drafter.name:
            return self.drafter
        options = options or self.drafter_options
        key = (name, tuple(sorted((k, repr(v)) for k, v in options.items())))
        if key not in self._named_drafters:  # built once (a drafter may load weights)
            from .drafters import create_drafter

            made = self._named_drafters[key] = create_drafter(name, self.target, **options)
            if self.warmed_up:  # as this decoder's own drafter was: its drafting cost starts warm, not cold
                self.warm_up(drafter=made)
        return self._named_drafters[key]

    # ---- public generation API ---------------------------------------------------------------
    def generate(
        self,
        prompt,
        config: GenerationConfig | None = None,
        *,
        drafter: str | None = None,
        speculation: SpeculationConfig | bool | None = None,
        **kwargs,
    ) -> GenerationResult:
        """Generates a whole completion. kwargs: GenerationConfig.create's (max_new_tokens, temperature, top_k, top_p,
        seed, stop, penalties, logit_bias, logprobs). drafter and speculation choose this call's speculation, as a
        server request's `speculation` object does: see stream()."""
        stream = self.stream(prompt, config, drafter=drafter, speculation=speculation, **kwargs)
        for _ in stream:
            pass
        assert stream.result is not None  # set once the stream is exhausted
        return stream.result

    def stream(
        self,
        prompt,
        config: GenerationConfig | None = None,
        *,
        drafter: str | None = None,
        speculation: SpeculationConfig | bool | None = None,
        **kwargs,
    ) -> "TextStream":
        """An iterator of text deltas; `.result` holds the GenerationResult once it is exhausted.
        drafter: a drafter's name for this call ("none": plain decoding; not given: the decoder's own).
        speculation: this call's SpeculationConfig (draft length, adaptive, sampling verifier), or False for plain
        decoding (not given: the decoder's)."""
        cfg = config or GenerationConfig.create(**kwargs)
        if speculation is not None and speculation is not False and not isinstance(speculation, SpeculationConfig):
            raise ConfigError(f"speculation must be a SpeculationConfig or False, got {speculation!r}")
        if speculation is False or drafter == "none":
            return TextStream(self.engine_for_one, self.encode(prompt), cfg, PLAIN, None)
        chosen = self.drafter if drafter is None else self.drafter_named(drafter)
        if chosen is not None and not self.costs.measured:  # loaded without a drafter: time the target now
            self.costs = CostModel(measure_verify_costs(self.target.backend))
        return TextStream(self.engine_for_one, self.encode(prompt), cfg, DrafterChoice(chosen), speculation)

    def generate_ids(self, prompt_ids: list[int], config: GenerationConfig) -> tuple[list[int], GenerationMetrics]:
        """Token-level generation without text handling (no stop strings): (generated ids, metrics)."""
        state = self.complete(prompt_ids, config)
        return state.generated, state.metrics

    def complete(
        self,
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: DrafterChoice = OWN_DRAFTER,
        speculation: SpeculationConfig | None = None,
        *,
        learn: bool = True,
        traced: bool = True,
    ) -> Request:
        """Runs one request to its end, token by token (no text, no stop strings), and returns its finished state.
        drafter: the decoder's own (OWN_DRAFTER), none (PLAIN) or DrafterChoice(a drafter); speculation: default the
        decoder's; learn: hand the output to the drafter (Drafter.learn); traced: recorded by trace_to's trace."""
        if not isinstance(drafter, DrafterChoice):
            raise TypeError(f"drafter must be a DrafterChoice (OWN_DRAFTER, PLAIN, ...), got {drafter!r}")
        engine = self.engine_for_one(learn=learn, traced=traced)
        state = engine.submit(0, prompt_ids, config, drafter, speculation)
        try:
            while not state.finished:
                for event in engine.step():
                    if event.error:
                        raise ConstraintError(event.error)
        finally:
            engine.cancel(0)  # nothing left to do once it ended
        return state

    def generate_many(
        self, prompts: list, config: GenerationConfig | None = None, max_batch: int = 16, **kwargs
    ) -> list[GenerationResult]:
        """Generates for several prompts at once, in batches that share each target pass (of up to max_batch
        sequences; steps with more than speculation.max_batch_for_drafting of them draft nothing)."""
        cfg = config or GenerationConfig.create(**kwargs)
        steps = TextSteps(self.batch_engine(max_batch))
        pending = list(enumerate(self.encode(p) for p in prompts))
        results: dict[object, GenerationResult] = {}
        while pending or len(steps.engine):
            while pending and steps.engine.free_slots > 0:
                i, ids = pending.pop(0)
                steps.submit(i, ids, cfg)
            for update in steps.step():
                if update.error:
                    raise ConstraintError(update.error)
                if update.finished:
                    results[update.request_id] = GenerationResult.of(update.state)
        return [results[i] for i in range(len(prompts))]

    def batch_engine(self, max_batch: int = 16, prefill_chunk: int | str | None = None) -> BatchEngine:
        """A BatchEngine over this decoder's target, drafter (OWN_DRAFTER: one fork per request) and costs.
        prefill_chunk: the prompt tokens a step prefills while other requests run (prefill.py; None: whole)."""
        factory = (lambda: self.drafter.fork()) if self.drafter is not None else (lambda: None)
        return BatchEngine(
            self.target.backend,
            factory,
            self.speculation,
            self.costs,
            max_batch=max_batch,
            tokenizer=self.target.tokenizer,
            tracer=self.tracer,
            prefill_chunk=prefill_chunk,
        )

    def engine_for_one(self, learn: bool = True, traced: bool = True) -> BatchEngine:
        """A BatchEngine for one request at a time, whose own drafter (OWN_DRAFTER) is this decoder's itself, not a
        fork: what it learns and measures carries on to the next request. A request alone may draft trees."""
        return BatchEngine(
            self.target.backend,
            lambda: self.drafter,
            self.speculation,
            self.costs,
            max_batch=1,
            tokenizer=self.target.tokenizer,
            tracer=self.tracer if traced else None,
            learn=learn,
        )
