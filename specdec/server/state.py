"""Server settings, and the state the request handlers share: admission (a bounded queue) and health."""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

from .errors import overloaded, shutting_down
from .schemas import Limits


@dataclass(frozen=True)
class ServerSettings:
    model_name: str  # the name clients send as `model` (and /v1/models lists)
    aliases: tuple[str, ...] = ()  # other names accepted as `model`
    max_batch: int = 16  # sequences decoded together (KV slots)
    max_queue: int = 64  # requests waiting for a slot beyond max_batch; more get 429
    api_key: str | None = None
    default_max_tokens: int = 256  # chat requests without max_tokens (clipped to the context left)
    max_prefill_tokens: int = 512  # prompt tokens that may join the batch in one step (at least one request)
    prefill_chunk: int | str | None = "auto"  # prompt tokens a step prefills while others run (prefill.py)
    max_body_bytes: int = 8 << 20
    drafter_options: dict = field(default_factory=dict)  # create_drafter's options for drafters requests pick
    tool_parser: str | None = None  # how "auto" tool calls are read from the text (server/tools.py), if at all
    logprobs_mode: str = "raw"  # what logprobs report (config.LOGPROBS_MODES)


class ServerState:
    """Lives on the event loop thread (no locks): counts requests admitted and not yet closed."""

    def __init__(self, settings: ServerSettings, worker, metrics):
        self.settings, self.worker, self.metrics = settings, worker, metrics
        from ..drafters import bundled_head
        from ..structured import unsupported_reason

        decoder = worker.decoder
        drafter = worker.default_drafter
        shipped = tuple(
            kind
            for kind in ("eagle", "eagle3", "medusa")  # heads specdec ships for this model
            if bundled_head(decoder.target.name, kind)
        )
        self.limits = Limits(
            model_names=(settings.model_name, *settings.aliases),
            drafters=tuple(dict.fromkeys(("none", "ngram", "suffix", "recycle", *shipped, "select", drafter))),
            default_drafter=drafter,
            vocab_size=decoder.target.info.vocab_size,
            default_max_tokens=settings.default_max_tokens,
            max_choices=settings.max_batch,
            structured_error=unsupported_reason(
                decoder.target.tokenizer, decoder.target.info.vocab_size, decoder.target.info.eos_token_ids
            ),
            tool_parser=settings.tool_parser,
            logprobs_mode=settings.logprobs_mode,
            max_context=decoder.target.info.max_context,
        )
        self.inflight = 0
        self.freed: deque[tuple[float, int]] = deque(maxlen=64)  # (monotonic time, places) of recent releases
        self.draining = False
        self.started = int(time.time())

    @property
    def capacity(self) -> int:
        return self.settings.max_batch + self.settings.max_queue

    def admit(self, choices: int = 1) -> None:
        """Takes a place for each of a request's choices, or raises 503 (shutting down) / 429 (full)."""
        if self.draining or not self.worker.accepting:
            raise shutting_down()
        if self.inflight + choices > self.capacity:
            raise overloaded(self.capacity, self.retry_after_s(choices))
        self.inflight += choices

    def release(self, choices: int = 1) -> None:
        self.inflight -= choices
        self.freed.append((time.monotonic(), choices))

    def retry_after_s(self, choices: int, now: float | None = None) -> int:
        """A 429's Retry-After: the seconds until `choices` places are likely free, at the rate places were freed
        over the last two minutes (whole seconds, 1 to 60; 1 when too few were freed to tell)."""
        now = time.monotonic() if now is None else now
        recent = [(t, n) for t, n in self.freed if now - t <= 120.0]
        if len(recent) < 2:
            return 1
        rate = sum(n for _, n in recent) / max(now - recent[0][0], 1e-3)  # places freed per second
        return max(1, min(60, math.ceil(choices / rate)))

    def health(self) -> dict:
        w = self.worker
        status = "draining" if self.draining else "ok" if w.alive else "engine stopped"
        return {
            "status": status,
            "model": self.settings.model_name,
            "drafter": w.default_drafter,
            "acceptance": str(w.engine.speculation.acceptance),
            "lossy": w.engine.speculation.acceptance.lossy,
            "max_batch": self.settings.max_batch,
            "prefix_cache": w.prefix_cache_entries,
            "max_context": w.decoder.target.info.max_context,
            "running": w.running,
            "queued": w.queued,
            "free_slots": self.settings.max_batch - w.running,
            "inflight": self.inflight,
            "capacity": self.capacity,
        }
