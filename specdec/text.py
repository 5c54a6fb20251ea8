"""A request's tokens as text: decoded one token at a time without splitting a character, and cut at the first
stop string (TextAssembler, which Request.take_text feeds)."""

from __future__ import annotations

from .errors import ConfigError


class IncrementalDetokenizer:
    """Decodes one token at a time without splitting multi-byte characters or losing leading spaces.

    Keeps a short window of earlier tokens (prefix) so that tokenizers whose pieces depend on the
    previous token decode as they would in the full text.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def add(self, token_id: int) -> str:
        self.ids.append(token_id)
        decode = self.tokenizer.decode
        prefix_text = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=True)
        new_text = decode(self.ids[self.prefix_offset :], skip_special_tokens=True)
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""


class StopStrings:
    """Finds the first stop string in growing text; tells how much text is safe to release."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.holdback = max((len(s) for s in stops), default=1) - 1

    def find(self, text: str, new_from: int) -> int:
        """Index where the earliest stop string starts, searching only matches that end after new_from; -1 if none."""
        start = max(0, new_from - self.holdback)
        hits = [i for i in (text.find(s, start) for s in self.stops) if i >= 0]
        return min(hits) if hits else -1

    def safe_length(self, text: str) -> int:
        """Characters that cannot be the start of a stop string still being completed."""
        return len(text) - self.holdback if self.stops else len(text)


class TextAssembler:
    """Generated tokens in, text deltas out: never splits a character, cuts at the first stop string.

    add() returns the text that is safe to show now and, once a stop string appears, how many of the
    given tokens were kept (the token that completed the stop string is the last one kept).
    """

    def __init__(self, tokenizer, stops: tuple[str, ...] = ()):
        if tokenizer is None and stops:
            raise ConfigError("stop strings need the model's tokenizer")
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.stops = StopStrings(stops)
        self.text = ""
        self.released = 0
        self.stopped = False

    def add(self, tokens: list[int]) -> tuple[str, int | None]:
        kept = None
        if self.detok is None:  # token-level use without a tokenizer: no text
            return "", None
        for i, token in enumerate(tokens):
            before = len(self.text)
            self.text += self.detok.add(token)
            if self.stops.stops and (cut := self.stops.find(self.text, before)) >= 0:
                self.text = self.text[:cut]
                self.stopped = True
                kept = i + 1
                break
        safe = len(self.text) if self.stopped else self.stops.safe_length(self.text)
        delta = self.text[self.released : safe] if safe > self.released else ""
        self.released = max(self.released, safe)
        return delta, kept

    def flush(self) -> str:
        """Whatever text was held back (a possible stop-string start) once generation has ended."""
        delta = self.text[self.released :]
        self.released = len(self.text)
        return delta
