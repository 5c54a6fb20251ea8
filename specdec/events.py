"""What a scheduler's step did for each request (StepEvent): the new tokens, and how it ended if it did."""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request


@dataclass
class StepEvent:
    """What one step did for one request."""

    request_id: object
    new_tokens: list[int]
    state: Request = field(repr=False)
    finished: str = ""  # "", "stop", "length", or "error" (the request's own step failed: see `error`)
    error: str = ""  # why a request ended in error (a ConstraintError), for it alone
