"""OpenAI response objects and stream chunks, built from the worker's Finished event.

Speculation statistics (an extension) travel in `usage.speculation` (summed over the request's choices) and,
on the streamed chunk that carries a choice's finish_reason, in a top-level `speculation` object:
{"drafter", "num_speculative_tokens", "drafted_tokens", "accepted_tokens", "acceptance_rate",
 "mean_accepted_tokens", "verify_steps", "drafting_steps", "mean_acceptance_length"}, and "drafter_steps"
({name: steps}) for the select drafter; acceptance_rate, MAT (over all verify steps) and the mean acceptance
length (1 + accepted / drafting steps, vLLM's figure) are null when nothing was drafted/verified; "acceptance"
(the rule: "exact", or a lossy one such as "top-k:4") and "lossy" (true when a lossy rule made the text, which may
then differ from the model's own; false for exact speculation and for requests that drafted nothing).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from functools import reduce

from ..logprobs import TokenLogprob
from ..metrics import GenerationMetrics
from .events import Finished

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


def speculation(fins: Finished | list[Finished]) -> dict:
    """One choice's speculation statistics, or the sums over a request's choices."""
    fins = fins if isinstance(fins, list) else [fins]
    total = reduce(GenerationMetrics.merge, [f.metrics for f in fins])
    return {
        "drafter": fins[0].drafter,
        "num_speculative_tokens": max(f.num_speculative_tokens for f in fins),
        "drafted_tokens": total.drafted_tokens,
        "accepted_tokens": total.accepted_tokens,
        "acceptance_rate": total.acceptance_rate,
        "mean_accepted_tokens": total.mean_accepted_tokens,
        "verify_steps": total.steps,
        "drafting_steps": total.drafting_steps,
        "mean_acceptance_length": total.mean_acceptance_length,
        "acceptance": total.acceptance,
        "lossy": total.lossy,
        # steps drafted by each drafter the select drafter chose
        **({"drafter_steps": total.drafter_steps} if total.drafter_steps else {}),
    }


def usage(fins: list[Finished]) -> dict:
    """The request's usage: the prompt once, the completions of all its choices."""
    prompt, completion = fins[0].prompt_tokens, sum(f.completion_tokens for f in fins)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": fins[0].metrics.cached_prompt_tokens},
        "speculation": speculation(fins),
    }


def response(
    meta: Meta,
    choices: list[tuple[str, Finished, dict | None]],
    answers: list[tuple[str | None, list[dict], str]] | None = None,
) -> dict:
    """A whole (non-streamed) completion or chat completion; choices: (text, Finished, logprobs from
    LogprobFormatter.format) in index order; answers: each chat choice's (content, tool calls, finish_reason)
    where the request has tools (ToolCalling.answer)."""
    out = []
    for index, (text, fin, logprobs) in enumerate(choices):
        choice = {"index": index, "logprobs": logprobs, "finish_reason": fin.finish_reason}
        if meta.chat:
            choice["message"] = {"role": "assistant", "content": text}
            if answers is not None:
                content, calls, choice["finish_reason"] = answers[index]
                choice["message"] = {
                    "role": "assistant",
                    "content": content,
                    **({"tool_calls": calls} if calls else {}),
                }
        else:
            choice["text"] = text
        out.append(choice)
    return {**meta.head(False), "choices": out, "usage": usage([fin for _, fin, _ in choices])}


def chunk(
    meta: Meta,
    text: str | None,
    fin: Finished | None = None,
    role: bool = False,
    logprobs: dict | None = None,
    index: int = 0,
    tool_calls: list[dict] | None = None,
    finish_reason: str | None = None,
) -> dict:
    """One streamed chunk of choice `index`: a text delta (with its tokens' logprobs), tool call deltas, the
    opening role (chat), or the closing finish_reason (fin's, unless `finish_reason` says otherwise)."""
    reason = (finish_reason or fin.finish_reason) if fin else None
    choice = {"index": index, "logprobs": logprobs, "finish_reason": reason}
    if meta.chat:
        choice["delta"] = (
            {"role": "assistant", "content": ""}
            if role
            else {"tool_calls": tool_calls}
            if tool_calls
            else {}
            if text is None
            else {"content": text}
        )
    else:
        choice["text"] = text or ""
    out = {**meta.head(True), "choices": [choice]}
    if fin is not None:
        out["speculation"] = speculation(fin)
    return out


class LogprobFormatter:
    """A response's logprobs in OpenAI's formats; token strings are the tokenizer's text of each token alone
    (bytes: its UTF-8 bytes; a token holding part of a character reads as U+FFFD, as in vLLM)."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.text_offset = 0  # completions: characters of the completion before the next token

    def _text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def chat(self, entries: list[TokenLogprob]) -> dict:
        """{"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}]}"""

        def one(token_id: int, logprob: float | None) -> dict:
            text = self._text(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        return {
            "content": [
                {**one(e.token_id, e.logprob), "top_logprobs": [one(i, lp) for i, lp in e.top]} for e in entries
            ]
        }

    def completion(self, entries: list[TokenLogprob]) -> dict:
        """{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}"""
        tokens = [self._text(e.token_id) for e in entries]
        offsets = []
        for token in tokens:
            offsets.append(self.text_offset)
            self.text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [None if e.logprob is None else {self._text(i): lp for i, lp in e.top} for e in entries],
            "text_offset": offsets,
        }

    def format(self, chat: bool, entries: list[TokenLogprob] | None) -> dict | None:
        """None for no entries (a chunk without tokens)."""
        if not entries:
            return None
        return self.chat(entries) if chat else self.completion(entries)


def usage_chunk(meta: Meta, fins: list[Finished]) -> dict:
    """The last chunk when stream_options.include_usage is set: no choices, the usage."""
    return {**meta.head(True), "choices": [], "usage": usage(fins)}


# Characters that JSON leaves raw but that line splitters such as Python's str.splitlines (httpx's aiter_lines)
# take for line ends: escaped, so that no client reads half an event.
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


def sse(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':')).translate(_LINE_BREAKS)}\n\n"
