"""Frozen, validated configuration for sampling, generation and speculation.

Modes are explicit: temperature 0 means greedy; top_k 0 and top_p 1.0 mean "off".
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

from .errors import ConfigError

DTYPES = ("auto", "bfloat16", "float16", "float32")
BACKENDS = ("auto", "kernels", "kernels-fp32", "kernels-bf16", "kernels-bf16kv", "torch", "hf")
GRAPHS = ("auto", "on", "off")  # the torch backend's passes as CUDA graphs (models/backend_choice.py graph_mode)
COMPILE = ("auto", "on", "off")  # those passes compiled by torch.compile (models/backend_choice.py compile_mode)
DEVICES = ("auto", "cpu", "cuda")
SAMPLING_VERIFIERS = ("auto", "rejection", "coupled")
ACCEPTANCE_FORMS = "exact, top-k:K (K >= 1), threshold:P (0 < P <= 1) or typical:EPS (0 < EPS < 1)"
MAX_TOP_LOGPROBS = 20  # alternatives listed per token, as OpenAI's top_logprobs
LOGPROBS_MODES = ("raw", "processed")  # logprobs of the raw logits, or of the distribution sampled from (vLLM's)


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _number_in(value, low: float, high: float) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and low <= value <= high


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
        _check(isinstance(self.temperature, (int, float)) and math.isfinite(self.temperature)
               and 0.0 <= self.temperature <= 100.0, f"temperature must be in [0, 100], got {self.temperature}")
        _check(isinstance(self.top_k, int) and self.top_k >= 0, f"top_k must be an integer >= 0, got {self.top_k}")
        _check(isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0,
               f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.seed is None or (isinstance(self.seed, int) and 0 <= self.seed < 2**63),
               f"seed must be an integer in [0, 2^63), got {self.seed}")
        _check(_number_in(self.min_p, 0.0, 1.0), f"min_p must be in [0, 1], got {self.min_p}")
        _check(_number_in(self.repetition_penalty, 0.0, 100.0) and self.repetition_penalty > 0,
               f"repetition_penalty must be in (0, 100], got {self.repetition_penalty}")
        for name in ("frequency_penalty", "presence_penalty"):
            _check(_number_in(getattr(self, name), -2.0, 2.0), f"{name} must be in [-2, 2], got {getattr(self, name)}")
        _check(isinstance(self.logit_bias, tuple) and all(
            isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], int) and pair[0] >= 0
            and _number_in(pair[1], -100.0, 100.0) for pair in self.logit_bias),
            "logit_bias must map token ids (integers >= 0) to biases in [-100, 100]")
        _check(len({t for t, _ in self.logit_bias}) == len(self.logit_bias), "logit_bias names a token twice")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether logits depend on the text so far (penalties) or are biased: see penalties.py."""
        return bool(self.logit_bias) or self.repetition_penalty != 1.0 or bool(self.frequency_penalty) \
            or bool(self.presence_penalty)


CONSTRAINT_KINDS = ("json_schema", "regex", "lark")


@dataclass(frozen=True)
class Constraint:
    """Structured output (structured.py). kind "json_schema": text is the schema as JSON; "regex" or "lark": the
    pattern or the grammar (llguidance's Lark dialect)."""

    kind: str
    text: str

    def __post_init__(self) -> None:
        _check(self.kind in CONSTRAINT_KINDS,
               f"constraint kind must be one of {', '.join(CONSTRAINT_KINDS)}, got {self.kind!r}")
        _check(isinstance(self.text, str) and bool(self.text), f"the {self.kind} constraint is empty")

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
        _check(isinstance(schema, dict), "a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(schema))

    @classmethod
    def of(cls, json_schema: dict | str | bool | None = None, regex: str | None = None,
           grammar: str | None = None) -> "Constraint | None":
        """At most one of json_schema (a schema, or True for any JSON object), regex and grammar (Lark) -> a
        Constraint, or None when none is given."""
        json_schema = None if json_schema is False else json_schema
        _check(sum(c is not None for c in (json_schema, regex, grammar)) <= 1,
               "give at most one of json_schema, regex and grammar")
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
        _check(isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1,
               f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            _check(value is None or (isinstance(value, int) and not isinstance(value, bool)
                                     and 0 <= value <= MAX_TOP_LOGPROBS),
                   f"{name} must be an integer in [0, {MAX_TOP_LOGPROBS}] (alternatives per token), got {value}")
        _check(self.logprobs_mode in LOGPROBS_MODES,
               f"logprobs_mode must be one of {', '.join(LOGPROBS_MODES)}, got {self.logprobs_mode!r}")
        _check(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")
        _check(len(self.stop) <= 16, "at most 16 stop strings are supported")

    @classmethod
    def create(cls, max_new_tokens: int = 256, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
               seed: int | None = None, stop: str | list[str] | tuple[str, ...] | None = None,
               ignore_eos: bool = False, min_p: float = 0.0, repetition_penalty: float = 1.0,
               frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
               logit_bias: dict[int, float] | None = None, logprobs: int | None = None,
               prompt_logprobs: int | None = None, logprobs_mode: str = "raw",
               json_schema: dict | str | bool | None = None, regex: str | None = None,
               grammar: str | None = None) -> "GenerationConfig":
        """Builds a config from flat keyword arguments, as `generate(**kwargs)` receives them. At most one of
        json_schema (a schema, or True for any JSON object), regex and grammar (Lark) constrains the output."""
        constraint = Constraint.of(json_schema, regex, grammar)
        if isinstance(stop, str):
            stop = (stop,)
        if logit_bias is not None and not isinstance(logit_bias, dict):
            raise ConfigError("logit_bias must be a dict of token id -> bias")
        sampling = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, min_p=min_p,
                                  repetition_penalty=repetition_penalty, frequency_penalty=frequency_penalty,
                                  presence_penalty=presence_penalty, logit_bias=tuple((logit_bias or {}).items()))
        return cls(max_new_tokens=max_new_tokens, sampling=sampling, stop=tuple(stop or ()), ignore_eos=ignore_eos,
                   logprobs=logprobs, prompt_logprobs=prompt_logprobs, constraint=constraint,
                   logprobs_mode=logprobs_mode)


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
            ok = _number_in(v, 0.0, 1.0) and v > 0
        elif self.mode == "typical":
            ok = _number_in(v, 0.0, 1.0) and 0 < v < 1
        else:
            ok = False
        _check(ok, f"acceptance must be {ACCEPTANCE_FORMS}, got {str(self)!r}")

    @property
    def lossy(self) -> bool:
        return self.mode != "exact"

    def __str__(self) -> str:
        if self.value is None:
            return self.mode
        number = _number_in(self.value, -math.inf, math.inf)  # else a bad value, printed as given
        return f"{self.mode}:{self.value:g}" if number else f"{self.mode}:{self.value}"

    @classmethod
    def parse(cls, text: "str | Acceptance") -> "Acceptance":
        """"exact" | "top-k:K" | "threshold:P" | "typical:EPS" -> an Acceptance; anything else raises ConfigError."""
        if isinstance(text, Acceptance):
            return text
        mode, _, number = str(text).strip().partition(":")
        try:
            value = None if not number else int(number) if mode == "top-k" else float(number)
        except ValueError:
            value = number  # refused below, in the same words as any other bad spec
        if mode != "exact" and value is None:
            raise ConfigError(f"acceptance must be {ACCEPTANCE_FORMS}, got {text!r}")
        return cls(mode, value)


EXACT = Acceptance()


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
        """"rejection" or "coupled" for a request with this SamplingConfig ("auto" decided by its seed)."""
        if self.sampling_verifier != "auto":
            return self.sampling_verifier
        return "coupled" if sampling.seed is not None else "rejection"

    def __post_init__(self) -> None:
        object.__setattr__(self, "acceptance", Acceptance.parse(self.acceptance))  # "top-k:4" -> Acceptance
        _check(isinstance(self.num_speculative_tokens, int) and 0 <= self.num_speculative_tokens <= 64,
               f"num_speculative_tokens must be in [0, 64], got {self.num_speculative_tokens}")
        _check(self.sampling_verifier in SAMPLING_VERIFIERS,
               f"sampling_verifier must be one of {', '.join(SAMPLING_VERIFIERS)}, got {self.sampling_verifier!r}")
        limit = self.max_batch_for_drafting
        _check(limit is None or (isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1),
               f"max_batch_for_drafting must be an integer >= 1 or None, got {limit!r}")

    def with_k(self, k: int) -> "SpeculationConfig":
        return replace(self, num_speculative_tokens=k)


def check_device_dtype(device: str, dtype: str) -> None:
    _check(device in DEVICES or device.startswith("cuda:"), f"device must be one of {', '.join(DEVICES)}, got {device!r}")
    _check(dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
