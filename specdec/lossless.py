"""Checks that speculation changes nothing, on the user's own model, drafter, prompts and sampler settings
(`specdec check-lossless`).

Greedy: each prompt is decoded twice, with drafting forced on at every step and plainly; the outputs must be
token-identical. A divergence where the target's two likeliest tokens are within `tie_margin` in log-probability
is a near-tie (kernels that score one token and several at once may round those apart), reported, not failed.

Sampling: N continuations of T tokens are drawn with speculation (drafting forced on; alone, or side by side in
the batched engine the server uses) and N plainly, one at a time, with other seeds. Pearson's chi-square test of homogeneity compares the two samples: their T-token outcomes, and the tokens at
each position. Where speculation is lossless both samples come from one distribution, each p-value is uniform,
and the check fails with probability at most alpha (Bonferroni over all tests); a wrong acceptance or resampling
rule shifts the speculative sample, and its p-values go to 0 as N grows. The reference is plain decoding's own
sampler, whatever it holds (temperature, top-k, top-p, min-p, penalties, logit bias).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Callable

import torch

from .choice import OWN_DRAFTER, PLAIN
from .config import GenerationConfig, SamplingConfig
from .speculation_config import SpeculationConfig
from .tokens import first_difference

MIN_EXPECTED = 5.0  # outcomes expected fewer times than this (in either sample) are pooled into one bin


@dataclass(frozen=True)
class HomogeneityTest:
    name: str  # what was compared: "joint" (the T-token outcomes) or "position N"
    statistic: float
    dof: int
    p_value: float  # 1.0 where the samples never vary (nothing to compare)


@dataclass
class SamplingCheck:
    sampling: SamplingConfig
    samples: int  # per arm
    tokens: int  # T, tokens per continuation
    tests: list[HomogeneityTest]
    drafted: int  # tokens the speculative arm drafted in all (0: verification was never exercised)
    accepted: int
    batch: int = 1  # speculative requests verified side by side (the batched engine where > 1)

    def to_dict(self) -> dict:
        return {
            "setting": describe(self.sampling),
            "samples": self.samples,
            "tokens": self.tokens,
            "batch": self.batch,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "tests": [vars(t) for t in self.tests],
        }


@dataclass
class GreedyCheck:
    prompt: str
    tokens: int  # of the plain output
    identical: bool
    divergence: int | None = None  # index of the first differing token
    margin: float | None = None  # plain decoding's top-1 minus top-2 log-probability there
    drafted: int = 0
    accepted: int = 0

    def near_tie(self, tie_margin: float) -> bool:
        return not self.identical and self.margin is not None and self.margin <= tie_margin


@dataclass
class LosslessReport:
    greedy: list[GreedyCheck] = field(default_factory=list)
    sampling: list[SamplingCheck] = field(default_factory=list)
    alpha: float = 1e-3
    tie_margin: float = 1e-4

    @property
    def threshold(self) -> float:
        """The p-value below which one test fails: alpha over the number of tests (Bonferroni)."""
        return self.alpha / max(1, sum(len(c.tests) for c in self.sampling))

    def failures(self) -> list[str]:
        """One line per failed check (none: lossless as far as these checks can tell)."""
        out = [
            f"greedy: prompt {i + 1} differs at token {g.divergence} (margin {g.margin:.3g} > {self.tie_margin:g})"
            for i, g in enumerate(self.greedy)
            if not g.identical and not g.near_tie(self.tie_margin)
        ]
        out += [
            f"sampling {describe(c.sampling)}: {t.name} p = {t.p_value:.3g} < {self.threshold:.3g}"
            for c in self.sampling
            for t in c.tests
            if t.p_value < self.threshold
        ]
        return out

    def unexercised(self) -> list[str]:
        """Checks whose speculative run drafted nothing (verification untested) or had no draft accepted (only the
        rejection branch tested)."""
        runs = [(f"greedy prompt {i + 1}", g.drafted, g.accepted) for i, g in enumerate(self.greedy)]
        runs += [(f"sampling {describe(c.sampling)}", c.drafted, c.accepted) for c in self.sampling]
        return [
            f"{name}: "
            + (
                "nothing was drafted, so verification was not exercised"
                if not drafted
                else "no draft was accepted, so only rejections were exercised"
            )
            for name, drafted, accepted in runs
            if not accepted
        ]

    def to_dict(self) -> dict:
        return {
            "alpha": self.alpha,
            "threshold": self.threshold,
            "tie_margin": self.tie_margin,
            "passed": not self.failures(),
            "failures": self.failures(),
            "unexercised": self.unexercised(),
            "greedy": [vars(g) for g in self.greedy],
            "sampling": [c.to_dict() for c in self.sampling],
        }


def describe(s: SamplingConfig) -> str:
    """The setting's non-default sampler fields, as `name=value` pairs."""
    default = SamplingConfig()
    parts = [
        f"{name}={getattr(s, name)}"
        for name in (
            "temperature",
            "top_k",
            "top_p",
            "min_p",
            "repetition_penalty",
            "frequency_penalty",
            "presence_penalty",
            "logit_bias",
        )
        if getattr(s, name) != getattr(default, name) or name == "temperature"
    ]
    return ",".join(parts)


def forced(speculation: SpeculationConfig) -> SpeculationConfig:
    """The same speculation with drafting on at every step, so every generated position is verified."""
    return replace(speculation, adaptive=False)


# ---- greedy --------------------------------------------------------------------------------------------
def check_greedy(
    decoder, prompt_ids: list[int], max_new_tokens: int, speculation: SpeculationConfig, label: str = ""
) -> GreedyCheck:
    """Greedy output with drafting forced on against plain greedy output (with its top-2 logprobs)."""
    spec_config = GenerationConfig(max_new_tokens=max_new_tokens)
    plain_config = replace(spec_config, logprobs=2)
    spec_state = decoder.complete(prompt_ids, spec_config, OWN_DRAFTER, forced(speculation))
    plain_state = decoder.complete(prompt_ids, plain_config, PLAIN)
    spec, plain = spec_state.generated, plain_state.generated
    check = GreedyCheck(
        label,
        len(plain),
        spec == plain,
        drafted=spec_state.metrics.drafted_tokens,
        accepted=spec_state.metrics.accepted_tokens,
    )
    logprobs = plain_state.logprobs or []
    if not check.identical:
        i = check.divergence = first_difference(spec, plain)
        if i is not None and i < len(logprobs) and len(logprobs[i].top) >= 2:
            (_, first), (_, second) = logprobs[i].top[:2]
            check.margin = first - second
    return check


# ---- sampling ------------------------------------------------------------------------------------------
def check_sampling(
    decoder,
    prompt_ids: list[int],
    sampling: SamplingConfig,
    samples: int,
    tokens: int,
    speculation: SpeculationConfig,
    batch: int = 1,
    progress: Callable[[int], None] | None = None,
) -> SamplingCheck:
    """Draws `samples` continuations of `tokens` tokens with speculation (seeds 0..N-1; `batch` > 1: that many at a
    time through the batched engine, the server's path) and as many plainly, one at a time (seeds N..2N-1), and
    tests the two samples for homogeneity. progress(n) is called as pairs are drawn."""
    spec_counts: Counter[tuple[int, ...]] = Counter()
    plain_counts: Counter[tuple[int, ...]] = Counter()
    drafted = accepted = 0
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True, sampling=sampling)
    for first in range(0, samples, batch):
        seeds = range(first, min(samples, first + batch))
        configs = [replace(config, sampling=replace(sampling, seed=seed)) for seed in seeds]
        for state in _draw(decoder, prompt_ids, configs, forced(speculation)):
            spec_counts[tuple(state.generated)] += 1
            drafted += state.metrics.drafted_tokens
            accepted += state.metrics.accepted_tokens
        for seed in seeds:
            plain = replace(config, sampling=replace(sampling, seed=samples + seed))
            plain_counts[tuple(decoder.complete(prompt_ids, plain, PLAIN).generated)] += 1
        if progress is not None:
            progress(len(seeds))
    tests = [homogeneity("joint", spec_counts, plain_counts)]
    for position in range(tokens):
        tests.append(
            homogeneity(f"position {position + 1}", _marginal(spec_counts, position), _marginal(plain_counts, position))
        )
    return SamplingCheck(sampling, samples, tokens, tests, drafted, accepted, batch)


def homogeneity(name: str, a: Counter, b: Counter, min_expected: float = MIN_EXPECTED) -> HomogeneityTest:
    """Pearson's chi-square test that two samples of outcomes come from one distribution: a 2 x C table of counts,
    with the outcomes expected fewer than `min_expected` times in either sample pooled into one column."""
    n_a, n_b = sum(a.values()), sum(b.values())
    total = n_a + n_b
    columns: list[tuple[int, int]] = []
    rare = [0, 0]
    for outcome in sorted(set(a) | set(b)):
        both = a[outcome] + b[outcome]
        if both * min(n_a, n_b) / total < min_expected:
            rare[0] += a[outcome]
            rare[1] += b[outcome]
        else:
            columns.append((a[outcome], b[outcome]))
    if rare[0] + rare[1]:
        columns.append((rare[0], rare[1]))
    if len(columns) < 2:
        return HomogeneityTest(name, 0.0, 0, 1.0)
    statistic = 0.0
    for count_a, count_b in columns:
        both = count_a + count_b
        for count, n in ((count_a, n_a), (count_b, n_b)):
            expected = both * n / total
            statistic += (count - expected) ** 2 / expected
    dof = len(columns) - 1
    return HomogeneityTest(name, statistic, dof, chi2_survival(statistic, dof))


def chi2_survival(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with `dof` degrees of freedom (the regularized upper gamma function)."""
    x = torch.tensor(statistic / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), x))


def _marginal(counts: Counter, position: int) -> Counter:
    out: Counter[int] = Counter()
    for outcome, n in counts.items():
        out[outcome[position]] += n
    return out


def _draw(decoder, prompt_ids: list[int], configs: list[GenerationConfig], speculation: SpeculationConfig):
    """Speculative requests with the decoder's drafter: one alone, or several side by side in one batch (each with
    a fork of the drafter, verified together). Returns their finished Requests."""
    if len(configs) == 1:
        return [decoder.complete(prompt_ids, configs[0], OWN_DRAFTER, speculation)]
    engine = decoder.batch_engine(len(configs))
    for i, config in enumerate(configs):
        engine.submit(i, prompt_ids, config, speculation=speculation)
    done = []
    while len(engine):
        done += [event.state for event in engine.step() if event.finished]
    return done
