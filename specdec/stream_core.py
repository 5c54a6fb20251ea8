"""The one stream core: a BatchEngine's steps turned into each request's text deltas, logprobs and end (TextSteps).
generate, stream and generate_many (engine.py) and the server (server/worker.py) all read their text from it."""
from __future__ import annotations

from dataclasses import dataclass, field

from .choice import OWN_DRAFTER, DrafterChoice
from .config import GenerationConfig, SpeculationConfig
from .logprobs import TokenLogprob
from .request import Request
from .scheduler import BatchEngine, StepEvent


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

    def submit(self, request_id, prompt_ids: list[int], config: GenerationConfig,
               drafter: DrafterChoice = OWN_DRAFTER, speculation: SpeculationConfig | None = None) -> Request:
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
            logprobs = state.logprobs[self.logprobs_sent.get(rid, 0):]
        if state.finished:
            self.logprobs_sent.pop(rid, None)
        else:
            self.logprobs_sent[rid] = len(state.logprobs or ())
        return TextUpdate(rid, text, len(new), state.finished, state, logprobs,
                          state.prompt_logprobs if first else None)
