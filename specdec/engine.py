"""The API: `SpecDecoder` loads a target and a drafter once, then generates, streams or batches many prompts.

Every call runs the scheduler's one step (scheduler.py; a request alone is a batch of one). With drafter None
the same step is plain autoregressive decoding (the baseline), so both run the same code.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

from .config import GenerationConfig, SpeculationConfig
from .drafters.base import Drafter
from .errors import ConfigError, ConstraintError
from .logprobs import TokenLogprob
from .metrics import GenerationMetrics
from .costs import CostModel, measure_verify_costs
from .request import Request
from .scheduler import BatchEngine, close_request, open_request


WARM_UP_PROMPT = "List the days of the week, then the months of the year."


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]  # generated tokens, the final EOS included
    prompt_ids: list[int]
    metrics: GenerationMetrics
    finish_reason: str  # "stop" (EOS or a stop string) or "length"
    logprobs: list[TokenLogprob] | None = None  # per generated token, when the config asked for them
    prompt_logprobs: list[TokenLogprob] | None = None  # per prompt token (the first has none), when asked for

    @classmethod
    def of(cls, request: Request) -> "GenerationResult":
        """The result of a request that ended, its text flushed."""
        return cls(text=request.text.text, token_ids=request.generated, prompt_ids=request.tokens[: request.prompt_len],
                   metrics=request.metrics, finish_reason=request.finished or "length", logprobs=request.logprobs,
                   prompt_logprobs=request.prompt_logprobs)


class SpecDecoder:
    """Speculative decoding over one target model and one drafter: lossless, unless its SpeculationConfig asks for
    a lossy acceptance rule (config.Acceptance)."""

    learn_outputs = True  # finished outputs go to the drafter (Drafter.learn); warm-up runs turn it off
    warmed_up = False  # after warm_up(): drafters built later by name are warmed up too
    tracer = None  # a TraceWriter (specdec/trace.py) recording every request, after trace_to()

    def __init__(self, target, drafter: Drafter | None = None, speculation: SpeculationConfig | None = None,
                 chat: bool = True, costs: CostModel | None = None):
        self.target = target  # LoadedModel
        self.drafter = drafter
        self.speculation = speculation or SpeculationConfig()
        self.chat = chat
        self.costs = costs or CostModel()
        self.drafter_options: dict = {}  # create_drafter's options for drafters that calls pick by name
        self._named_drafters: dict[tuple, Drafter] = {}  # by (name, options)

    @classmethod
    def load(cls, model: str | None = None, *, drafter: str = "auto", draft_model=None, device: str = "auto",
             dtype: str = "auto", num_speculative_tokens: int = 8, adaptive: bool = True,
             sampling_verifier: str = "auto", chat: bool = True, trust_remote_code: bool = False,
             backend: str = "auto", calibrate: bool = True, max_batch_for_drafting: int | None = None,
             acceptance: str = "exact", graphs: str = "auto", **drafter_options) -> "SpecDecoder":
        """Loads a target (default: the built-in smollm2-135m) and a drafter by name. max_batch_for_drafting: see
        SpeculationConfig (batched decoding drafts nothing in steps with more sequences than this). acceptance:
        "exact" (lossless) or a LOSSY rule, "top-k:K", "threshold:P" or "typical:EPS" (config.Acceptance). graphs:
        the torch backend's passes as CUDA graphs (auto, on, off: models/loading.py make_backend)."""
        from .drafters import create_drafter
        from .models.loading import load_model
        from .models.registry import DEFAULT_MODEL

        speculation = SpeculationConfig(num_speculative_tokens=num_speculative_tokens, adaptive=adaptive,
                                        sampling_verifier=sampling_verifier,
                                        max_batch_for_drafting=max_batch_for_drafting, acceptance=acceptance)
        target = load_model(model or DEFAULT_MODEL, device=device, dtype=dtype,
                            trust_remote_code=trust_remote_code, backend=backend, graphs=graphs)
        made = create_drafter(drafter, target, draft_model=draft_model, trust_remote_code=trust_remote_code,
                              **drafter_options)
        costs = CostModel(measure_verify_costs(target.backend)) if calibrate and made is not None else None
        decoder = cls(target, made, speculation, chat=chat, costs=costs)
        decoder.drafter_options = {"draft_model": draft_model, "trust_remote_code": trust_remote_code,
                                   **drafter_options}
        if calibrate:
            decoder.warm_up()
        return decoder

    def warm_up(self, max_new_tokens: int = 16, drafter: Drafter | None = None) -> None:
        """Runs a short generation twice with drafting forced on: the first run pays the drafter's first-call
        costs (allocations, kernel selection), the second measures its cost per drafted position, so the
        draft-length policy starts from a warm figure. drafter: default this decoder's own; drafters built later
        by name (drafter_named) are warmed up in turn. Nothing to do without a drafter, or without the room for it
        in a (very) short context."""
        self.warmed_up = True
        drafter = drafter or self.drafter
        if drafter is None:
            return
        forced = SpecDecoder(self.target, drafter, replace(self.speculation, adaptive=False), chat=self.chat,
                             costs=self.costs)
        forced.learn_outputs = False  # its outputs are no request's: a drafter that learns (suffix) skips them
        ids = forced.encode(WARM_UP_PROMPT)
        if len(ids) + max_new_tokens + self.speculation.num_speculative_tokens + 1 > self.target.info.max_context:
            return
        for _ in range(2):
            self.costs.for_drafter(drafter.name).reset_draft()
            forced.generate_ids(ids, GenerationConfig(max_new_tokens=max_new_tokens))

    def enable_prefix_cache(self, max_entries: int = 16) -> bool:
        """Keeps up to `max_entries` finished sequences' KV caches, so that prompts beginning as an earlier one
        (a system prompt, a chat's earlier turns) skip that part of their prefill; 0 turns it off. False where the
        backend keeps no cache slots (transformers' forward): nothing is cached there."""
        enable = getattr(self.target.backend, "enable_prefix_cache", None)
        if enable is None:
            return False
        enable(max_entries)
        return max_entries > 0

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
    def generate(self, prompt, config: GenerationConfig | None = None, *, drafter: str | None = None,
                 speculation: SpeculationConfig | bool | None = None, **kwargs) -> GenerationResult:
        """Generates a whole completion. kwargs: GenerationConfig.create's (max_new_tokens, temperature, top_k, top_p,
        seed, stop, penalties, logit_bias, logprobs). drafter and speculation choose this call's speculation, as a
        server request's `speculation` object does: see stream()."""
        stream = self.stream(prompt, config, drafter=drafter, speculation=speculation, **kwargs)
        for _ in stream:
            pass
        return stream.result

    def stream(self, prompt, config: GenerationConfig | None = None, *, drafter: str | None = None,
               speculation: SpeculationConfig | bool | None = None, **kwargs) -> "TextStream":
        """An iterator of text deltas; `.result` holds the GenerationResult once it is exhausted.
        drafter: a drafter's name for this call ("none": plain decoding; default: the decoder's own).
        speculation: this call's SpeculationConfig (draft length, adaptive, sampling verifier), or False for plain
        decoding (default: the decoder's)."""
        cfg = config or GenerationConfig.create(**kwargs)
        if speculation is not None and not isinstance(speculation, (bool, SpeculationConfig)):
            raise ConfigError(f"speculation must be a SpeculationConfig, True or False, got {speculation!r}")
        if speculation is False or drafter == "none":
            chosen, speculation = None, None
        else:
            chosen = self.drafter if drafter is None else self.drafter_named(drafter)
            if chosen is not None and not self.costs.measured:  # loaded without a drafter: time the target now
                self.costs = CostModel(measure_verify_costs(self.target.backend))
            speculation = speculation if isinstance(speculation, SpeculationConfig) else None
        return TextStream(self, self.encode(prompt), cfg, chosen, speculation)

    def generate_ids(self, prompt_ids: list[int], config: GenerationConfig) -> tuple[list[int], GenerationMetrics]:
        """Token-level generation without text handling (no stop strings): (generated ids, metrics)."""
        state = self.complete(prompt_ids, config)
        return state.generated, state.metrics

    def complete(self, prompt_ids: list[int], config: GenerationConfig, drafter: Drafter | None | str = "default",
                 speculation: SpeculationConfig | None = None) -> Request:
        """Runs one request to its end (drafter and speculation as start() takes them); returns its finished state."""
        state = self.start(prompt_ids, config, drafter, speculation)
        for _ in self.decode(state):
            pass
        return state

    def generate_many(self, prompts: list, config: GenerationConfig | None = None, max_batch: int = 16,
                      **kwargs) -> list[GenerationResult]:
        """Generates for several prompts at once, in batches that share each target pass (of up to max_batch
        sequences; steps with more than speculation.max_batch_for_drafting of them draft nothing)."""
        cfg = config or GenerationConfig.create(**kwargs)
        engine = self.batch_engine(max_batch)
        pending = list(enumerate(self.encode(p) for p in prompts))
        results: dict[int, GenerationResult] = {}
        while pending or len(engine):
            while pending and engine.free_slots > 0:
                i, ids = pending.pop(0)
                engine.add(i, ids, cfg)
            for event in engine.step():
                if event.error:
                    raise ConstraintError(event.error)
                state = event.state
                _, stopped = state.take_text(event.new_tokens)
                if stopped:  # free its slot now (a no-op when the engine already ended it)
                    engine.cancel(event.request_id)
                if state.finished:
                    state.flush_text()
                    results[event.request_id] = GenerationResult.of(state)
        return [results[i] for i in range(len(prompts))]

    def batch_engine(self, max_batch: int = 16) -> BatchEngine:
        """A BatchEngine over this decoder's target, drafter (one fork per request) and costs."""
        factory = (lambda: self.drafter.fork()) if self.drafter is not None else (lambda: None)
        return BatchEngine(self.target.backend, factory, self.speculation, self.costs, max_batch=max_batch,
                           tokenizer=self.target.tokenizer, tracer=self.tracer)

    # ---- one request at a time ---------------------------------------------------------------
    def start(self, prompt_ids: list[int], config: GenerationConfig, drafter: Drafter | None | str = "default",
              speculation: SpeculationConfig | None = None) -> Request:
        """A request, holding its KV cache slot until decode() or end() ends it. drafter: "default" (the decoder's
        own), None (plain decoding) or a Drafter; speculation: default the decoder's."""
        request = Request(prompt_ids, config, self.target.backend.info,
                          self.drafter if drafter == "default" else drafter, speculation or self.speculation,
                          self.costs, learn=self.learn_outputs, tokenizer=self.target.tokenizer, tracer=self.tracer)
        return open_request(self.target.backend, request)

    def end(self, state: Request) -> None:
        """Ends a request from start() at once, freeing its slot (decode() ends those it runs); idempotent."""
        close_request(self.target.backend, state)

    def decode(self, state: Request) -> Iterator[list[int]]:
        """Runs one request to its end, yielding each step's new tokens: the scheduler's step with a batch of
        one (the same step serves generate_many and the server), so a request alone may draft trees."""
        engine = self.batch_engine(max_batch=1)
        engine.admit(0, state)
        try:
            while not state.finished:
                for event in engine.step():
                    if event.error:
                        raise ConstraintError(event.error)
                    yield event.new_tokens
        finally:
            self.end(state)


class TextStream:
    """Iterates over text deltas of one generation; stop strings end it early and are cut off."""

    def __init__(self, decoder: SpecDecoder, prompt_ids: list[int], config: GenerationConfig,
                 drafter: Drafter | None | str = "default", speculation: SpeculationConfig | None = None):
        self.decoder = decoder
        self.prompt_ids, self.config = list(prompt_ids), config
        self.drafter, self.speculation = drafter, speculation  # as SpecDecoder.start takes them
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        # holds a cache slot until decode() ends
        seq = self.decoder.start(self.prompt_ids, self.config, self.drafter, self.speculation)
        steps = self.decoder.decode(seq)
        try:
            for new in steps:
                delta, _ = seq.take_text(new)
                if delta:
                    yield delta
                if seq.finished:
                    break
        finally:
            steps.close()
            self.decoder.end(seq)
        if tail := seq.flush_text():
            yield tail
        self.result = GenerationResult.of(seq)
