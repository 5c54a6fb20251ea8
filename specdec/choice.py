"""Which drafter drafts for a request: an explicit value, where `None` and the string "default" used to stand in.

- OWN_DRAFTER: the engine's own (SpecDecoder's drafter; in a batch, a fork of it per request);
- PLAIN: none, plain decoding (the same step with nothing drafted: the baseline);
- DrafterChoice(drafter): that Drafter instance (a drafter chosen by name, a fork); DrafterChoice(None) is PLAIN.
"""

from __future__ import annotations

from dataclasses import dataclass

from .drafters.base import Drafter


@dataclass(frozen=True)
class DrafterChoice:
    drafter: Drafter | None = None  # or None for plain decoding unless `own`
    own: bool = False  # the engine's own drafter, whatever it is

    @property
    def plain(self) -> bool:
        """Whether nothing drafts for the request (plain decoding)."""
        return not self.own and self.drafter is None


OWN_DRAFTER = DrafterChoice(own=True)
PLAIN = DrafterChoice()
