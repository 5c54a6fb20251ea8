"""Frozen, validated configuration for sampling and generation, and the acceptance rules (speculation_config.py: how
drafts are proposed and checked).

Modes are explicit: temperature 0 means greedy; top_k 0 and top_p 1.0 mean "off".
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from .errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
BACKENDS = ("auto", "kernels", "kernels-fp32", "kernels-bf16", "kernels-bf16kv", "torch", "hf")
GRAPHS = ("auto", "on", "off")  # the torch backend's passes as CUDA graphs (models/backend_choice.py graph_mode)
COMPILE = ("auto", "on", "off")  # those passes compiled by torch.compile (models/backend_choice.py compile_mode)
MAX_TOP_LOGPROBS = 20  # alternatives listed per token, as OpenAI's top_logprobs
LOGPROBS_MODES = ("raw", "processed")  # logprobs of the raw logits, or of the distribution sampled from (vLLM's)
ACCEPTANCE_FORMS = "exact, top-k:K (K >= 1), threshold:P (0 < P <= 1) or typical:EPS (0 < EPS < 1)"


def check(cond: bool, message: str) -> None:
    """Raises ConfigError(message) unless cond."""
    if not cond:
        raise ConfigError(message)


def number_in(value, low: float, high: float) -> bool:
    """Whether value is a finite int or float (not a bool) in [low, high]."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and low <= value <= high
    )


@dataclass(frozen=True)
class SamplingConfig:
    """How the target's next-token distribution p is formed and sampled.

    temperature 0 is greedy decoding (argmax); otherwise logits are divided by the temperature,
    then top-k, top-p (nucleus) and min-p filtering apply, in that order (as in transformers).
    Before either, the penalties that depend on the text so far (penalties.py): logit_bias ((token id, bias)
    pairs), repetition_penalty (1: off), frequency_penalty and presence_penalty (0: off).
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        check(
            isinstance(self.temperature, (int, float))
            and math.isfinite(self.temperature)
            and 0.0 <= self.temperature <= 100.0,
            f"temperature must be in [0, 100], got {self.temperature}",
        )
        check(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k}")
        check(
            isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0,
            f"top_p must be in (0, 1], got {self.top_p}",
        )
        check(
            self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
            f"seed must be an integer in [0, 2^63), got {self.seed}",
        )
        check(number_in(self.min_p, 0.0, 1.0), f"min_p must be in [0, 1], got {self.min_p}")
        check(
            number_in(self.repetition_penalty, 0.0, 100.0) and self.repetition_penalty > 0,
            f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}",
        )
        for name in ("frequency_penalty", "presence_penalty"):
            check(number_in(getattr(self, name), -2.0, 2.0), f"{name} must be in [-2, 2], got {getattr(self, name)}")
        check(
            isinstance(self.logit_bias, tuple)
            and all(
                isinstance(pair, tuple)
                and len(pair) == 2
                and isinstance(pair[0], int)
                and pair[0] >= 0
                and number_in(pair[1], -100.0, 100.0)
                for pair in self.logit_bias
            ),
            "logit_bias must map token ids (integers >= 0) to biases in [-100, 100]",
        )
        check(len({t for t, _ in self.logit_bias}) == len(self.logit_bias), "logit_bias names a token twice")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether logits depend on the text so far (penalties) or are biased: see penalties.py."""
        return (
            bool(self.logit_bias)
            or self.repetition_penalty != 1.0
            or bool(self.frequency_penalty)
            or bool(self.presence_penalty)
        )


CONSTRAINT_KINDS = ("json_schema", "regex", "lark")


@dataclass(frozen=True)
class Constraint:
    """Structured output (structured.py). kind "json_schema": text is the schema as JSON; "regex" or "lark": the
    pattern or the grammar (llguidance's Lark dialect)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        check(
            self.kind in CONSTRAINT_KINDS,
            f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}",
        )
        check(isinstance(self.text, str) and bool(self.text), f"the {self.kind} constraint is empty")

    @classmethod
    def json_schema(cls, schema: dict | str | None = None) -> "Constraint":
        """A JSON schema (a dict or its JSON text); None: any JSON object."""
        if schema is None:
            schema = {"type": "object"}
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ConfigError(f"the JSON schema is not valid JSON: {exc}") from None
        check(isinstance(schema, dict), "a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def of(
        cls, json_schema: dict | str | bool | None = None, regex: str | None = None, grammar: str | None = None
    ) -> "Constraint | None":
        """At most one of json_schema (a schema, or True for any JSON object), regex and grammar (Lark) -> a
        Constraint, or None when none is given."""
        json_schema = None if json_schema is False else json_schema
        check(
            sum(c is not None for c in (json_schema, regex, grammar)) <= 1,
            "give at most one of json_schema, regex and grammar",
        )
        if json_schema is not None:
            return cls.json_schema(None if json_schema is True else json_schema)
        if regex is not None:
            return cls("regex", regex)
        return None if grammar is None else cls("lark", grammar)


@dataclass(frozen=True)
class GenerationConfig:
    """What to generate: length, stopping and sampling."""

    max_new_tokens: int = 256
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; N >= 0: each token's logprob and the N most likely (logprobs.py)
    prompt_logprobs: int | None = None  # the same for the prompt's tokens (its first one has none)
    constraint: Constraint | None = None  # structured output: JSON schema, regex or grammar (structured.py)
    logprobs_mode: str = "raw"  # "raw": of the model's logits; "processed": of the distribution sampled from

    def __post_init__(self) -> None:
        check(
            isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
            f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}",
        )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            check(
                value is None
                or (isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOP_LOGPROBS),
                f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token), got {value}",
            )
        check(
            self.logprobs_mode in LOGPROBS_MODES,
            f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}",
        )
        check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")
        check(len(self.stop) <= 16, "at most 16 stop strings are supported")

    @classmethod
    def create(
        cls,
        max_new_tokens: int = 256,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int | None = None,
        stop: str | list[str] | tuple[str, ...] | None = None,
        ignore_eos: bool = False,
        min_p: float = 0.0,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        logit_bias: dict[int, float] | None = None,
        logprobs: int | None = None,
        prompt_logprobs: int | None = None,
        logprobs_mode: str = "raw",
        json_schema: dict | str | bool | None = None,
        regex: str | None = None,
        grammar: str | None = None,
    ) -> "GenerationConfig":
        """Builds a config from flat keyword arguments, as `generate(**kwargs)` receives them. At most one of
        json_schema (a schema, or True for any JSON object), regex and grammar (Lark) constrains the output."""
        constraint = Constraint.of(json_schema, regex, grammar)
        if isinstance(stop, str):
            stop = (stop,)
        if logit_bias is not None and not isinstance(logit_bias, dict):
            raise ConfigError("logit_bias must be a dict of token id -> bias")
        sampling = SamplingConfig(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            min_p=min_p,
            repetition_penalty=repetition_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            logit_bias=tuple((logit_bias or {}).items()),
        )
        return cls(
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop=tuple(stop or ()),
            ignore_eos=ignore_eos,
            logprobs=logprobs,
            prompt_logprobs=prompt_logprobs,
            constraint=constraint,
            logprobs_mode=logprobs_mode,
        )


@dataclass(frozen=True)
class Acceptance:
    """Which drafted tokens the target accepts (verify/). "exact" (the default) is lossless: the output is the
    target's own greedy text or sampling distribution. The others are LOSSY: they also accept a draft the target
    finds plausible without choosing it, trading fidelity for longer accepted runs (verify/lossy.py):
      "top-k" (value K): the draft is among the K most probable tokens of the target's row;
      "threshold" (value P): the target gives the draft probability >= P;
      "typical" (value EPS): Medusa's typical acceptance, p(draft) > min(EPS, sqrt(EPS) * exp(-entropy)).
    `parse` reads the spec string ("exact", "top-k:4", "threshold:0.3", "typical:0.2"); str() writes it back.
    """

    mode: str = "exact"
    value: float | None = None  # K, P or EPS; None for exact

    def __post_init__(self) -> None:
        v = self.value
        if self.mode == "exact":
            ok = v is None
        elif self.mode == "top-k":
            ok = isinstance(v, int) and not isinstance(v, bool) and v >= 1
        elif self.mode == "threshold":
            ok = v is not None and number_in(v, 0.0, 1.0) and v > 0
        elif self.mode == "typical":
            ok = v is not None and number_in(v, 0.0, 1.0) and 0 < v < 1
        else:
            ok = False
        check(ok, f"acceptance must be {ACCEPTANCE_FORMS}, got {str(self)!r}")

    @property
    def lossy(self) -> bool:
        return self.mode != "exact"

    def __str__(self) -> str:
        if self.value is None:
            return self.mode
        number = number_in(self.value, -math.inf, math.inf)  # else a bad value, printed as given
        return f"{self.mode}:{self.value:g}" if number else f"{self.mode}:{self.value}"

    @classmethod
    def parse(cls, text: "str | Acceptance") -> "Acceptance":
        """ "exact" | "top-k:K" | "threshold:P" | "typical:EPS" -> an Acceptance; anything else raises ConfigError."""
        if isinstance(text, Acceptance):
            return text
        mode, _, number = str(text).strip().partition(":")
        refused = ConfigError(f"acceptance must be {ACCEPTANCE_FORMS}, got {text!r}")
        try:
            value = None if not number else int(number) if mode == "top-k" else float(number)
        except ValueError:
            raise refused from None
        if mode != "exact" and value is None:
            raise refused
        return cls(mode, value)


EXACT = Acceptance()
