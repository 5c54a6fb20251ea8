"""How drafts are proposed and checked: the SpeculationConfig a decoder, a server or a request speculates with."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .config import EXACT, Acceptance, check

SAMPLING_VERIFIERS = ("auto", "rejection", "coupled")


@dataclass(frozen=True)
class SpeculationConfig:
    """How drafts are proposed and checked.

    num_speculative_tokens is k, the most tokens drafted per step. With adaptive on, the engine picks
    k in [0, num_speculative_tokens] each step from measured acceptance and measured costs, so that
    speculation backs off (k = 0 is a plain decoding step) when drafts do not pay.
    sampling_verifier picks the lossless check used when sampling:
      "rejection": accept with min(1, p/q), resample from norm(max(0, p - q)) (Leviathan et al.).
      "coupled": every position's sample is the argmax of log p plus Gumbel noise drawn from
                 (seed, position); a draft token is accepted when it equals that sample. Equally
                 lossless, and the same seed gives the same text with or without speculation.
      "auto" (the default): coupled for a request with a seed, which asks for the same text again (rejection
                 sampling's text depends on how many tokens were drafted, and that follows measured costs);
                 rejection otherwise.
    max_batch_for_drafting (vLLM's disable_by_batch_size): in batched decoding, a step that verifies more
    sequences than this drafts for none of them (k = 0, no probes, drafters not called) until the batch
    shrinks; None: no limit, the cost model alone decides.
    acceptance: exact (lossless, the default) or a LOSSY rule (Acceptance); a spec string is parsed.
    """

    num_speculative_tokens: int = 8
    adaptive: bool = True
    sampling_verifier: str = "auto"
    max_batch_for_drafting: int | None = None
    acceptance: Acceptance = EXACT

    def verifier_for(self, sampling) -> str:
        """ "rejection" or "coupled" for a request with this SamplingConfig ("auto" decided by its seed)."""
        if self.sampling_verifier != "auto":
            return self.sampling_verifier
        return "coupled" if sampling.seed is not None else "rejection"

    def __post_init__(self) -> None:
        object.__setattr__(self, "acceptance", Acceptance.parse(self.acceptance))  # "top-k:4" -> Acceptance
        check(
            isinstance(self.num_speculative_tokens, int) and 0 <= self.num_speculative_tokens <= 64,
            f"num_speculative_tokens must be in [0, 64], got {self.num_speculative_tokens}",
        )
        check(
            self.sampling_verifier in SAMPLING_VERIFIERS,
            f"sampling_verifier must be one of {', '.join(SAMPLING_VERIFIERS)}, got {self.sampling_verifier!r}",
        )
        limit = self.max_batch_for_drafting
        check(
            limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1),
            f"max_batch_for_drafting must be an integer >= 1 or None, got {limit!r}",
        )

    def with_k(self, k: int) -> "SpeculationConfig":
        return replace(self, num_speculative_tokens=k)
