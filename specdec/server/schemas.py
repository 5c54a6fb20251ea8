"""OpenAI request bodies -> a validated GenerationRequest; anything unsupported or out of range -> a 400.

Both endpoints share the sampling fields; defaults follow OpenAI (temperature 1, top_p 1; max_tokens 16
for completions, the server's default for chat); `presence_penalty`, `frequency_penalty`, `logit_bias` and
logprobs (chat: `logprobs`, `top_logprobs`; completions: `logprobs`, with `echo` for the prompt's too; up to 20
alternatives) as OpenAI defines them; structured output by `response_format` (json_object, json_schema); function
calling by `tools` and `tool_choice` (chat; see tools.py).
Extensions (as in vLLM): `top_k` (0 or -1: off), `min_p`, `repetition_penalty`, `ignore_eos`, `guided_json`,
`guided_regex`, `guided_grammar` (Lark), and `speculation`: {"enabled": false} drafts nothing; {"drafter": NAME,
"num_speculative_tokens": k} picks the drafter (one of Limits.drafters) and the most tokens drafted per step for
this request; {"acceptance": "exact" | "top-k:K" | "threshold:P" | "typical:EPS"} its acceptance rule (the last
three are LOSSY, and labelled so in usage.speculation).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import MAX_TOP_LOGPROBS, SAMPLING_VERIFIERS, Acceptance, Constraint, GenerationConfig, SamplingConfig
from ..errors import ConfigError
from ..structured import check
from .errors import APIError, bad_request, model_not_found, unsupported
from .fields import boolean, integer, logit_bias, number, stops
from .messages import parse_messages, parse_prompt
from .tools import ToolCalling, parse_tool_calling

COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream", "stream_options", "n",
          "speculation", "ignore_eos", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
          "logit_bias", "response_format", "guided_json", "guided_regex", "guided_grammar"}
FIELDS = {"chat": COMMON | {"messages", "max_completion_tokens", "logprobs", "top_logprobs", "tools", "tool_choice",
                            "parallel_tool_calls"},
          "completions": COMMON | {"prompt", "logprobs", "echo"}}
IGNORED = {"user", "metadata", "store", "service_tier"}
NEUTRAL = {  # accepted only at the value that changes nothing
    "best_of": (1,), "echo": (False,), "suffix": ("",),
    "tools": ([],), "tool_choice": ("none",), "functions": ([],),
    "function_call": ("none",), "min_tokens": (0,), "modalities": (["text"],),
}
MAX_TOKENS = 10**7  # max_tokens beyond any context


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the names it answers to, the drafters a request may pick, defaults."""

    model_names: tuple[str, ...]
    # "none", "ngram", "suffix", shipped heads ("eagle", "eagle3", "medusa"), "select", the server's own
    drafters: tuple[str, ...]
    default_drafter: str
    vocab_size: int
    default_max_tokens: int = 256
    max_choices: int = 16  # the most choices (`n`) in one request: the server's batch size
    structured_error: str | None = None  # why this model's tokenizer cannot do structured output, if it cannot
    tool_parser: str | None = None  # how "auto" tool calls are read from the text (tools.PARSERS), if at all
    logprobs_mode: str = "raw"  # what logprobs report: "raw" or "processed" (config.LOGPROBS_MODES)
    max_context: int = MAX_TOKENS + 2  # tokens one sequence holds (prompt, output, drafts): the server's --max-context

    @property
    def max_tokens(self) -> int:
        """The largest max_tokens that can fit the context: after a one-token prompt, drafting nothing."""
        return min(MAX_TOKENS, self.max_context - 2)


@dataclass(frozen=True)
class SpeculationChoice:
    drafter: str  # one of Limits.drafters; "none" is plain decoding
    num_speculative_tokens: int | None = None  # None: the server's k
    sampling_verifier: str | None = None  # None: the server's ("auto", "rejection" or "coupled")
    adaptive: bool | None = None  # None: the server's; False drafts num_speculative_tokens every step
    acceptance: str | None = None  # None: the server's; else "exact" or a lossy rule (config.Acceptance)


@dataclass(frozen=True)
class GenerationRequest:
    endpoint: str  # "chat" or "completions"
    model: str
    prompt: object  # chat: [{"role", "content": str}]; completions: a string or token ids
    config: GenerationConfig
    max_tokens_given: bool  # False: config.max_new_tokens is a default, clipped to the context left
    speculation: SpeculationChoice
    stream: bool
    include_usage: bool
    n: int = 1  # choices: engine requests over the same prompt
    echo: bool = False  # completions: the prompt comes back before the completion (with its logprobs if asked for)
    tool_calling: ToolCalling | None = None  # chat with tools: the tools and how the answer may call them


def parse_request(body, endpoint: str, limits: Limits) -> GenerationRequest:
    """Validates a decoded JSON body for `endpoint` ("chat" or "completions"); raises APIError."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object")
    _check_fields(body, endpoint)
    model = _model(body, limits)
    if endpoint == "chat":
        prompt = parse_messages(body.get("messages"))
        given = body.get("max_completion_tokens")
        name = "max_completion_tokens" if given is not None else "max_tokens"
        default = limits.default_max_tokens
    else:
        prompt = parse_prompt(body.get("prompt"), limits.vocab_size)
        name, default = "max_tokens", 16
    max_tokens = integer(body, name, None, 1, MAX_TOKENS)
    if max_tokens is not None and max_tokens > limits.max_tokens:  # refused at once, not after a wait in the queue
        raise bad_request(f"'{name}' ({max_tokens}) does not fit this server's context of {limits.max_context} tokens "
                          f"(at most {limits.max_tokens}, less the prompt)", name, "context_length_exceeded")
    stream = boolean(body, "stream", False)
    include_usage = _stream_options(body.get("stream_options"), stream)
    n = integer(body, "n", 1, 1, limits.max_choices)
    top_k = integer(body, "top_k", 0, -1, 10**9)
    echo = endpoint == "completions" and boolean(body, "echo", False)
    logprobs = _logprobs(body, endpoint)
    calling = parse_tool_calling(body, limits.tool_parser, limits.structured_error) if endpoint == "chat" else None
    if calling is not None and calling.calls and logprobs is not None:
        raise unsupported("logprobs", "cannot be combined with tool calls")
    try:
        sampling = SamplingConfig(temperature=float(number(body, "temperature", 1.0, 0.0, 2.0)),
                                  top_p=float(number(body, "top_p", 1.0, 0.0, 1.0, low_open=True)),
                                  top_k=max(top_k, 0), seed=integer(body, "seed", None, 0, 2**63 - 1),
                                  min_p=float(number(body, "min_p", 0.0, 0.0, 1.0)),
                                  repetition_penalty=float(number(body, "repetition_penalty", 1.0, 0.0, 100.0,
                                                                   low_open=True)),
                                  frequency_penalty=float(number(body, "frequency_penalty", 0.0, -2.0, 2.0)),
                                  presence_penalty=float(number(body, "presence_penalty", 0.0, -2.0, 2.0)),
                                  logit_bias=logit_bias(body.get("logit_bias"), limits.vocab_size))
        config = GenerationConfig(max_new_tokens=max_tokens or default, sampling=sampling, stop=stops(body.get("stop")),
                                  ignore_eos=boolean(body, "ignore_eos", False), logprobs=logprobs,
                                  logprobs_mode=limits.logprobs_mode,
                                  prompt_logprobs=logprobs if echo else None,
                                  constraint=(calling and calling.constraint()) or _constraint(
                                      body, limits.structured_error))
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    return GenerationRequest(endpoint=endpoint, model=model, prompt=prompt, config=config,
                             max_tokens_given=max_tokens is not None,
                             speculation=_speculation(body.get("speculation"), limits), stream=stream,
                             include_usage=include_usage, n=n, echo=echo, tool_calling=calling)


def _check_fields(body: dict, endpoint: str) -> None:
    for name, value in body.items():
        if name in FIELDS[endpoint] or name in IGNORED or value is None:
            continue
        if name in NEUTRAL:
            if not any(_same(value, ok) for ok in NEUTRAL[name]):
                raise unsupported(name)
            continue
        raise APIError(400, f"Unrecognized request argument supplied: {name}", param=name, code="unrecognized_argument")


def _same(value, ok) -> bool:
    number = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    return value == ok and (type(value) is type(ok) or (number(value) and number(ok)))


def _model(body: dict, limits: Limits) -> str:
    model = body.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter", "model", "missing_required_parameter")
    if not isinstance(model, str):
        raise bad_request("'model' must be a string", "model", "invalid_type")
    if model not in limits.model_names:
        raise model_not_found(model, limits.model_names[0])
    return model


def _logprobs(body: dict, endpoint: str) -> int | None:
    """Alternatives per token to return with each token's logprob, or None for no logprobs. Chat: `logprobs`
    (boolean) and `top_logprobs`; completions: `logprobs` (the number of alternatives)."""
    if endpoint == "completions":
        return integer(body, "logprobs", None, 0, MAX_TOP_LOGPROBS)
    wanted = boolean(body, "logprobs", False)
    top = integer(body, "top_logprobs", None, 0, MAX_TOP_LOGPROBS)
    if top and not wanted:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs", "invalid_value")
    return (top or 0) if wanted else None


def _constraint(body: dict, unsupported: str | None) -> Constraint | None:
    """Structured output: OpenAI's response_format (json_object, json_schema), or vLLM's guided_json,
    guided_regex and guided_grammar (Lark); at most one; compiled here, so that a bad one is a 400."""
    given = [name for name in ("response_format", "guided_json", "guided_regex", "guided_grammar")
             if body.get(name) is not None]
    if len(given) > 1:
        raise bad_request(f"give at most one of {', '.join(given)}", given[1], "invalid_value")
    if not given:
        return None
    name, value = given[0], body[given[0]]
    try:
        if name == "response_format":
            constraint = _response_format(value)
        elif name == "guided_json":
            if not isinstance(value, (dict, str)):
                raise bad_request("'guided_json' must be a JSON schema", name, "invalid_type")
            constraint = Constraint.json_schema(value)
        else:
            if not isinstance(value, str) or not value:
                raise bad_request(f"'{name}' must be a non-empty string", name, "invalid_type")
            constraint = Constraint("regex" if name == "guided_regex" else "lark", value)
        if constraint is not None:
            check(constraint)
            if unsupported:
                raise bad_request(f"structured output is not available for this model: {unsupported}", name,
                                  "unsupported_parameter")
        return constraint
    except ConfigError as exc:
        raise bad_request(str(exc), name, "invalid_value") from None


def _response_format(value) -> Constraint | None:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint.json_schema(None)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad_request("'response_format.json_schema.schema' must be a JSON schema object",
                              "response_format", "invalid_value")
        return Constraint.json_schema(schema)
    raise bad_request("'response_format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                      "{\"type\": \"json_schema\", \"json_schema\": {\"schema\": ...}}", "response_format",
                      "invalid_value")


def _stream_options(value, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options", "invalid_value")
    if not isinstance(value, dict) or set(value) - {"include_usage"}:
        raise bad_request("'stream_options' must be an object with 'include_usage' only", "stream_options",
                          "invalid_type")
    return boolean(value, "include_usage", False, "stream_options.include_usage")


def _speculation(value, limits: Limits) -> SpeculationChoice:
    if value is None:
        return SpeculationChoice(limits.default_drafter)
    if not isinstance(value, dict):
        raise bad_request("'speculation' must be an object", "speculation", "invalid_type")
    for key in value:
        if key not in ("enabled", "drafter", "num_speculative_tokens", "sampling_verifier", "adaptive", "acceptance"):
            raise unsupported(f"speculation.{key}")
    enabled = boolean(value, "enabled", True, "speculation.enabled")
    drafter = value.get("drafter", limits.default_drafter)
    if drafter not in limits.drafters:
        raise bad_request(f"'speculation.drafter' must be one of {', '.join(limits.drafters)}, got {drafter!r}",
                          "speculation.drafter", "invalid_value")
    k = integer(value, "num_speculative_tokens", None, 0, 64, "speculation.num_speculative_tokens")
    verifier = value.get("sampling_verifier")
    if verifier is not None and verifier not in SAMPLING_VERIFIERS:
        raise bad_request(f"'speculation.sampling_verifier' must be one of {', '.join(SAMPLING_VERIFIERS)}, got "
                          f"{verifier!r}", "speculation.sampling_verifier", "invalid_value")
    adaptive = boolean(value, "adaptive", None, "speculation.adaptive")
    return SpeculationChoice(drafter if enabled else "none", k, verifier, adaptive, _acceptance(value))


def _acceptance(speculation: dict) -> str | None:
    """speculation.acceptance as its canonical spec ("top-k:4"), None when absent; a bad one is a 400."""
    value = speculation.get("acceptance")
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request("'speculation.acceptance' must be a string", "speculation.acceptance", "invalid_type")
    try:
        return str(Acceptance.parse(value))
    except ConfigError as exc:
        raise bad_request(f"'speculation.acceptance': {exc}", "speculation.acceptance", "invalid_value") from None


