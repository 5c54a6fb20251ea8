"""OpenAI response objects and stream chunks, built from the worker's Finished event.

Speculation statistics (an extension) travel in `usage.speculation` and, on the streamed chunk that
carries finish_reason, in a top-level `speculation` object:
{"drafter", "num_speculative_tokens", "drafted_tokens", "accepted_tokens", "acceptance_rate",
 "mean_accepted_tokens", "verify_steps"}; acceptance_rate and MAT are null when nothing was drafted/verified.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from .worker import Finished

DONE = "data: [DONE]\n\n"


@dataclass(frozen=True)
class Meta:
    """What every object of one response shares."""

    chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self):
        if not self.id:
            object.__setattr__(self, "id", ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex)

    def head(self, stream: bool) -> dict:
        kind = ("chat.completion.chunk" if stream else "chat.completion") if self.chat else "text_completion"
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


def speculation(fin: Finished) -> dict:
    m = fin.metrics
    return {"drafter": fin.drafter, "num_speculative_tokens": fin.num_speculative_tokens,
            "drafted_tokens": m.drafted_tokens, "accepted_tokens": m.accepted_tokens,
            "acceptance_rate": m.acceptance_rate, "mean_accepted_tokens": m.mean_accepted_tokens,
            "verify_steps": m.steps}


def usage(fin: Finished) -> dict:
    return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
            "total_tokens": fin.prompt_tokens + fin.completion_tokens, "speculation": speculation(fin)}


def response(meta: Meta, text: str, fin: Finished) -> dict:
    """A whole (non-streamed) completion or chat completion."""
    choice = {"index": 0, "logprobs": None, "finish_reason": fin.finish_reason}
    if meta.chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    return {**meta.head(False), "choices": [choice], "usage": usage(fin)}


def chunk(meta: Meta, text: str | None, fin: Finished | None = None, role: bool = False) -> dict:
    """One streamed chunk: a text delta, the opening role (chat), or the closing finish_reason."""
    choice = {"index": 0, "logprobs": None, "finish_reason": fin.finish_reason if fin else None}
    if meta.chat:
        choice["delta"] = ({"role": "assistant", "content": ""} if role else
                           {} if text is None else {"content": text})
    else:
        choice["text"] = text or ""
    out = {**meta.head(True), "choices": [choice]}
    if fin is not None:
        out["speculation"] = speculation(fin)
    return out


def usage_chunk(meta: Meta, fin: Finished) -> dict:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    return {**meta.head(True), "choices": [], "usage": usage(fin)}


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"
