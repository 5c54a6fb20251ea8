"""A validated request body (protocol.py) bound to this server -> a GenerationRequest (schemas.py); what the body's
schema cannot say -> a 400 (or a 404 for a model this server does not serve).

The server decides the model names, the drafters a request may pick, the context and so the largest max_tokens,
the vocabulary (token ids in prompts and logit_bias) and the batch size (`n`); fields that depend on each other
are checked here too: top_logprobs needs logprobs, stream_options needs stream, at most one structured-output
field, a tool message names its call. Defaults follow OpenAI (temperature 1, top_p 1; max_tokens 16 for
completions, the server's default for chat). `speculation`: {"enabled": false} drafts nothing; {"drafter": NAME,
"num_speculative_tokens": k} picks the drafter (one of Limits.drafters) and the most tokens drafted per step for
this request; {"acceptance": "exact" | "top-k:K" | "threshold:P" | "typical:EPS"} its acceptance rule (the last
three are LOSSY, and labelled so in usage.speculation).
"""

from __future__ import annotations

from ..config import Acceptance, Constraint, GenerationConfig, SamplingConfig
from ..errors import ConfigError
from ..structured import check
from .errors import bad_request, model_not_found
from .messages import parse_messages, parse_prompt
from .protocol import (
    RESPONSE_FORMATS,
    ChatRequest,
    CompletionsRequest,
    GenerationBody,
    ResponseFormat,
    Speculation,
)
from .schemas import GenerationRequest, Limits, SpeculationChoice
from .tools import parse_tool_calling
from .validation import validated


def parse_request(body: object, endpoint: str, limits: Limits) -> GenerationRequest:
    """Validates a decoded JSON body for `endpoint` ("chat" or "completions") and binds it; raises APIError."""
    request: ChatRequest | CompletionsRequest = (
        validated(ChatRequest, body) if endpoint == "chat" else validated(CompletionsRequest, body)
    )
    return bind(request, limits)


def bind(request: ChatRequest | CompletionsRequest, limits: Limits) -> GenerationRequest:
    """A body the protocol's models validated, checked against this server's limits; raises APIError."""
    model = _model(request.model, limits)
    chat = isinstance(request, ChatRequest)
    prompt: list[dict] | str | list[int]
    if isinstance(request, ChatRequest):
        prompt = parse_messages(request.messages)
        given = request.max_completion_tokens
        name = "max_completion_tokens" if given is not None else "max_tokens"
        max_tokens = given if given is not None else request.max_tokens
        default = limits.default_max_tokens
    else:
        prompt = parse_prompt(request.prompt, limits.vocab_size)
        name, default, max_tokens = "max_tokens", 16, request.max_tokens
    if max_tokens is not None and max_tokens > limits.max_tokens:  # refused at once, not after a wait in the queue
        raise bad_request(
            f"'{name}' ({max_tokens}) does not fit this server's context of {limits.max_context} tokens "
            f"(at most {limits.max_tokens}, less the prompt)",
            name,
            "context_length_exceeded",
        )
    stream = bool(request.stream)
    include_usage = _stream_options(request, stream)
    n = request.n if request.n is not None else 1
    if n > limits.max_choices:
        raise bad_request(f"'n' must be in [1, {limits.max_choices}], got {n}", "n", "invalid_value")
    echo = isinstance(request, CompletionsRequest) and bool(request.echo)
    logprobs = _logprobs(request)
    calling = (
        parse_tool_calling(request, limits.tool_parser, limits.structured_error)
        if isinstance(request, ChatRequest)
        else None
    )
    if calling is not None and calling.calls and logprobs is not None:
        raise bad_request("'logprobs' cannot be combined with tool calls", "logprobs", "unsupported_parameter")
    try:
        sampling = _sampling(request, limits.vocab_size)
        stop = request.stop if request.stop is not None else ()
        config = GenerationConfig(
            max_new_tokens=max_tokens or default,
            sampling=sampling,
            stop=(stop,) if isinstance(stop, str) else tuple(stop),
            ignore_eos=bool(request.ignore_eos),
            logprobs=logprobs,
            logprobs_mode=limits.logprobs_mode,
            prompt_logprobs=logprobs if echo else None,
            constraint=(calling and calling.constraint()) or _constraint(request, limits.structured_error),
        )
    except ConfigError as exc:
        raise bad_request(str(exc)) from None
    return GenerationRequest(
        endpoint="chat" if chat else "completions",
        model=model,
        prompt=prompt,
        config=config,
        max_tokens_given=max_tokens is not None,
        speculation=_speculation(request.speculation, limits),
        stream=stream,
        include_usage=include_usage,
        n=n,
        echo=echo,
        tool_calling=calling,
    )


def _sampling(request: GenerationBody, vocab_size: int) -> SamplingConfig:
    """The sampling fields, OpenAI's defaults where absent (temperature 1, top_p 1; top_k 0 or -1: off)."""

    def given(value: float | None, default: float) -> float:
        return default if value is None else value

    return SamplingConfig(
        temperature=given(request.temperature, 1.0),
        top_p=given(request.top_p, 1.0),
        top_k=max(request.top_k or 0, 0),
        seed=request.seed,
        min_p=given(request.min_p, 0.0),
        repetition_penalty=given(request.repetition_penalty, 1.0),
        frequency_penalty=given(request.frequency_penalty, 0.0),
        presence_penalty=given(request.presence_penalty, 0.0),
        logit_bias=_logit_bias(request.logit_bias, vocab_size),
    )


def _model(model: str, limits: Limits) -> str:
    if model not in limits.model_names:
        raise model_not_found(model, limits.model_names[0])
    return model


def _logprobs(request: ChatRequest | CompletionsRequest) -> int | None:
    """Alternatives per token to return with each token's logprob, or None for no logprobs. Chat: `logprobs`
    (boolean) and `top_logprobs`; completions: `logprobs` (the number of alternatives)."""
    if not isinstance(request, ChatRequest):
        return request.logprobs
    top = request.top_logprobs
    if top and not request.logprobs:
        raise bad_request("'top_logprobs' requires 'logprobs' to be true", "top_logprobs", "invalid_value")
    return (top or 0) if request.logprobs else None


def _logit_bias(value: dict[str, float] | None, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: {"token id": bias} -> ((id, bias), ...); the ids below the vocabulary's size."""
    pairs = []
    for key, bias in (value or {}).items():
        if not int(key) < vocab_size:
            raise bad_request(
                f"'logit_bias' keys must be token ids in [0, {vocab_size}), got {key!r}", "logit_bias", "invalid_value"
            )
        pairs.append((int(key), bias))
    return tuple(pairs)


def _constraint(request: GenerationBody, unsupported: str | None) -> Constraint | None:
    """Structured output: OpenAI's response_format (json_object, json_schema), or vLLM's guided_json,
    guided_regex and guided_grammar (Lark); at most one; compiled here, so that a bad one is a 400."""
    given = [
        name
        for name in ("response_format", "guided_json", "guided_regex", "guided_grammar")
        if getattr(request, name) is not None
    ]
    if len(given) > 1:
        raise bad_request(f"give at most one of {', '.join(given)}", given[1], "invalid_value")
    if not given:
        return None
    name, value = given[0], getattr(request, given[0])
    try:
        if name == "response_format":
            constraint = _response_format(value)
        elif name == "guided_json":
            constraint = Constraint.json_schema(value)
        else:
            constraint = Constraint("regex" if name == "guided_regex" else "lark", value)
        if constraint is not None:
            check(constraint)
            if unsupported:
                raise bad_request(
                    f"structured output is not available for this model: {unsupported}", name, "unsupported_parameter"
                )
        return constraint
    except ConfigError as exc:
        raise bad_request(str(exc), name, "invalid_value") from None


def _response_format(value: ResponseFormat) -> Constraint | None:
    if value.type not in RESPONSE_FORMATS:
        raise bad_request(
            '\'response_format\' must be {"type": "text"}, {"type": "json_object"} or '
            '{"type": "json_schema", "json_schema": {"schema": ...}}',
            "response_format",
            "invalid_value",
        )
    if value.type == "text":
        return None
    if value.type == "json_object":
        return Constraint.json_schema(None)
    if value.json_schema is None or value.json_schema.schema_ is None:
        raise bad_request(
            "'response_format.json_schema.schema' must be a JSON schema object", "response_format", "invalid_value"
        )
    return Constraint.json_schema(value.json_schema.schema_)


def _stream_options(request: GenerationBody, stream: bool) -> bool:
    if request.stream_options is None:
        return False
    if not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options", "invalid_value")
    return bool(request.stream_options.include_usage)


def _speculation(value: Speculation | None, limits: Limits) -> SpeculationChoice:
    if value is None:
        return SpeculationChoice(limits.default_drafter)
    drafter = value.drafter if value.drafter is not None else limits.default_drafter
    if drafter not in limits.drafters:
        raise bad_request(
            f"'speculation.drafter' must be one of {', '.join(limits.drafters)}, got {drafter!r}",
            "speculation.drafter",
            "invalid_value",
        )
    enabled = value.enabled is not False
    return SpeculationChoice(
        drafter if enabled else "none",
        value.num_speculative_tokens,
        value.sampling_verifier,
        value.adaptive,
        _acceptance(value.acceptance),
    )


def _acceptance(value: str | None) -> str | None:
    """speculation.acceptance as its canonical spec ("top-k:4"), None when absent; a bad one is a 400."""
    if value is None:
        return None
    try:
        return str(Acceptance.parse(value))
    except ConfigError as exc:
        raise bad_request(f"'speculation.acceptance': {exc}", "speculation.acceptance", "invalid_value") from None
