"""Per-request speculation metrics: one dataclass that the request fills (request.count_step_metrics); logs,
Prometheus and benchmark JSON only read it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class GenerationMetrics:
    """Counters and timings of one generation.

    A verify step is one target forward over the last token plus k draft tokens. It yields the
    accepted drafts plus one token of the target's own (the correction at the first rejection, or the
    bonus token when all k were accepted), so mean_accepted_tokens (MAT) counts that token too. MAT is
    over all verify steps, including those where the adaptive policy drafted nothing (k = 0);
    mean_acceptance_length is over drafting steps only (1 + accepted / drafting steps), the figure vLLM
    reports as "mean acceptance length" and the EAGLE papers as tau, so it compares across engines.
    acceptance is the rule that accepted the drafts (config.Acceptance's spec): "exact" (lossless) unless a LOSSY
    rule was asked for, in which case `lossy` is true and every report of these metrics says so.
    """

    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of the prompt, the tokens whose prefill the prefix cache saved
    new_tokens: int = 0
    steps: int = 0
    drafting_steps: int = 0  # verify steps that scored at least one drafted token
    step_tokens: int = 0  # tokens emitted by verify steps (new_tokens minus the one from prefill)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    drafter_steps: dict[str, int] = field(default_factory=dict)  # steps drafted by each drafter a selector chose
    prefill_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    total_time_s: float = 0.0
    finish_reason: str = ""
    acceptance: str = "exact"  # "exact", or a lossy rule's spec ("top-k:4"); "mixed" for sums over several rules

    @property
    def lossy(self) -> bool:
        """Whether a lossy acceptance rule made this output (it may then differ from the target's own)."""
        return self.acceptance != "exact"

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else None

    @property
    def mean_accepted_tokens(self) -> float | None:
        return self.step_tokens / self.steps if self.steps else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1.0 + self.accepted_tokens / self.drafting_steps if self.drafting_steps else None

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def merge(self, other: "GenerationMetrics") -> "GenerationMetrics":
        """Sums two requests' metrics (for aggregates over a benchmark or a server's lifetime)."""
        out = GenerationMetrics()
        for name in (
            "prompt_tokens",
            "cached_prompt_tokens",
            "new_tokens",
            "steps",
            "drafting_steps",
            "step_tokens",
            "drafted_tokens",
            "accepted_tokens",
            "prefill_time_s",
            "draft_time_s",
            "verify_time_s",
            "total_time_s",
        ):
            setattr(out, name, getattr(self, name) + getattr(other, name))
        n = max(len(self.drafted_per_position), len(other.drafted_per_position))
        pad = lambda xs: xs + [0] * (n - len(xs))  # noqa: E731
        out.drafted_per_position = [
            a + b for a, b in zip(pad(self.drafted_per_position), pad(other.drafted_per_position))
        ]
        out.accepted_per_position = [
            a + b for a, b in zip(pad(self.accepted_per_position), pad(other.accepted_per_position))
        ]
        out.acceptance = self.acceptance if self.acceptance == other.acceptance else "mixed"
        out.drafter_steps = {
            name: self.drafter_steps.get(name, 0) + other.drafter_steps.get(name, 0)
            for name in {**self.drafter_steps, **other.drafter_steps}
        }
        return out

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            lossy=self.lossy,
            acceptance_rate=self.acceptance_rate,
            mean_accepted_tokens=self.mean_accepted_tokens,
            mean_acceptance_length=self.mean_acceptance_length,
            per_position_acceptance=self.per_position_acceptance,
            tokens_per_s=self.tokens_per_s,
        )
        return d

    def summary(self) -> str:
        """One human-readable line, as `specdec generate --stats` prints it."""
        rate = self.acceptance_rate
        mat, mal = self.mean_accepted_tokens, self.mean_acceptance_length
        return (
            f"{self.new_tokens} tokens in {self.total_time_s:.2f}s ({self.tokens_per_s:.1f} tok/s) | "
            f"steps {self.steps} | drafted {self.drafted_tokens} accepted {self.accepted_tokens}"
            f" ({'n/a' if rate is None else f'{rate:.0%}'}) | MAT {'n/a' if mat is None else f'{mat:.2f}'}"
            + ("" if mal is None else f" ({mal:.2f} over {self.drafting_steps} drafting steps)")
            + " | "
            f"prefill {self.prefill_time_s * 1e3:.0f} ms, draft {self.draft_time_s:.2f}s, verify {self.verify_time_s:.2f}s"
            f" | finish {self.finish_reason}"
            + (
                " | drafted by " + ", ".join(f"{name} {n}" for name, n in sorted(self.drafter_steps.items()))
                if self.drafter_steps
                else ""
            )
            + (
                f" | LOSSY acceptance {self.acceptance}: the output may differ from the model's own"
                if self.lossy
                else ""
            )
        )
