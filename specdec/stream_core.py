"""The one stream core: a BatchEngine's steps turned into each request's text deltas, logprobs and end (TextSteps).
generate, stream and generate_many (engine.py) and the server (server/worker.py) all read their text from it: a
stream as a TextStream, a request that ended as a GenerationResult."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator

from .choice import OWN_DRAFTER, DrafterChoice
from .config import GenerationConfig
from .speculation_config import SpeculationConfig
from .errors import ConstraintError
from .logprobs import TokenLogprob
from .metrics import GenerationMetrics
from .events import StepEvent
from .request import Request
from .scheduler import BatchEngine


@dataclass
class TextUpdate:
    """What one step did for one request, as text: the one stream core's output (TextSteps)."""

    request_id: object
    text: str  # the text delta: held back while it may start a stop string, the rest flushed once it ended
    new_tokens: int  # tokens the step generated (those past a stop string included)
    finished: str  # "", "stop", "length", or "error" (see error)
    state: Request = field(repr=False)
    logprobs: list[TokenLogprob] | None = None  # the kept new tokens' logprobs, when the request asked for them
    prompt_logprobs: list[TokenLogprob] | None = None  # in a request's first update, when it asked for them
    error: str = ""  # why its own step failed (a ConstraintError): it ended there


class TextSteps:
    """The one stream core: runs a BatchEngine's steps and turns each request's step events into text deltas,
    logprobs and the end. A stop string ends its request here (cancelled at once, freeing its slot; Request.take_text
    cuts it), and the text held back is flushed when a request ends. generate, stream, generate_many and the server
    all read their text from it; the server converts it to OpenAI's format."""

    def __init__(self, engine: BatchEngine):
        self.engine = engine
        self.logprobs_sent: dict[object, int] = {}  # request id -> its logprobs handed out, while it runs

    def submit(
        self,
        request_id,
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: DrafterChoice = OWN_DRAFTER,
        speculation: SpeculationConfig | None = None,
    ) -> Request:
        """BatchEngine.submit."""
        return self.engine.submit(request_id, prompt_ids, config, drafter, speculation)

    def cancel(self, request_id) -> None:
        """Ends a request at once (BatchEngine.cancel); nothing happens for one that already ended."""
        self.logprobs_sent.pop(request_id, None)
        self.engine.cancel(request_id)

    def step(self) -> list[TextUpdate]:
        return [self._update(event) for event in self.engine.step()]

    def _update(self, event: StepEvent) -> TextUpdate:
        rid, state, new = event.request_id, event.state, event.new_tokens
        first = rid not in self.logprobs_sent
        if event.error:
            self.logprobs_sent.pop(rid, None)
            return TextUpdate(rid, "", 0, "error", state, error=event.error)
        text, stopped = state.take_text(new)
        if stopped:  # free its slot now
            self.engine.cancel(rid)  # nothing happens when its step already ended it
        if state.finished:
            text += state.flush_text()
        logprobs = None
        if state.logprobs is not None:
            logprobs = state.logprobs[self.logprobs_sent.get(rid, 0) :]
        if state.finished:
            self.logprobs_sent.pop(rid, None)
        else:
            self.logprobs_sent[rid] = len(state.logprobs or ())
        return TextUpdate(
            rid, text, len(new), state.finished, state, logprobs, state.prompt_logprobs if first else None
        )


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
        return cls(
            text=request.text.text,
            token_ids=request.generated,
            prompt_ids=request.tokens[: request.prompt_len],
            metrics=request.metrics,
            finish_reason=request.finished or "length",
            logprobs=request.logprobs,
            prompt_logprobs=request.prompt_logprobs,
        )


class TextStream:
    """Iterates over text deltas of one generation; stop strings end it early and are cut off."""

    def __init__(
        self,
        new_engine: Callable[[], BatchEngine],
        prompt_ids: list[int],
        config: GenerationConfig,
        drafter: DrafterChoice = OWN_DRAFTER,
        speculation: SpeculationConfig | None = None,
    ):
        self.new_engine = new_engine  # a decoder's engine_for_one
        self.prompt_ids, self.config = list(prompt_ids), config
        self.drafter, self.speculation = drafter, speculation  # as BatchEngine.submit takes them
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[str]:
        steps = TextSteps(self.new_engine())
        state = steps.submit(0, self.prompt_ids, self.config, self.drafter, self.speculation)  # holds a cache slot
        try:
            while not state.finished:
                for update in steps.step():
                    if update.error:
                        raise ConstraintError(update.error)
                    if update.text:
                        yield update.text
        finally:
            steps.cancel(0)  # frees its slot if it was left unfinished
        self.result = GenerationResult.of(state)
