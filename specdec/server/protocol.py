"""The OpenAI protocol's request bodies as pydantic models: /v1/completions and /v1/chat/completions.

FastAPI validates each body against these models and writes the OpenAPI document (GET /openapi.json) from them;
a body they refuse is a 400 in OpenAI's format naming the field (validation.py). What depends on the server (the
model names, the drafters, the context, the vocabulary, the batch size) and what ties fields together (top_logprobs
needs logprobs, stream_options needs stream, one structured-output field at most) is checked afterwards, when the
body is bound to the server's limits (binding.py); the document shows the server's own names and limits
(document.py).

Defaults follow OpenAI; the extensions are vLLM's (top_k, min_p, repetition_penalty, ignore_eos, guided_*) and
specdec's `speculation` object. A null field is the field left out, as OpenAI's clients send unset fields.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StrictStr, model_validator
from pydantic_core import PydanticCustomError

from ..config import ACCEPTANCE_FORMS, MAX_TOP_LOGPROBS
from .protocol_types import INT64_MAX, Boolean, Ignored, JsonSchemaObject, Neutral, Text, finite, integral

MAX_TOKENS = 10**7  # max_tokens beyond any context
MAX_STOPS = 16
MAX_LOGIT_BIAS = 1024  # entries in one request's logit_bias
MAX_SPECULATIVE_TOKENS = 64
_FRACTION = r"0?\.[0-9]*[1-9][0-9]*"  # a decimal in (0, 1)
# what config.Acceptance.parse takes: K >= 1, 0 < P <= 1, 0 < EPS < 1 (in decimals, as clients write them)
ACCEPTANCE_PATTERN = rf"^(exact|top-k:[1-9][0-9]{{0,17}}|threshold:({_FRACTION}|1(\.0*)?)|typical:{_FRACTION})$"
RESPONSE_FORMATS = ("text", "json_object", "json_schema")
TOOL_NAME = r"^[A-Za-z0-9_-]{1,64}$"
FITS = (
    "when not given: the server's default, clipped to the context left; when given, the prompt, max_tokens and "
    "the draft length must fit the server's context{of}, or the request is refused (400, "
    "context_length_exceeded)"
)

# the fields' ranges: the bounds first, then the check of the value's type, so that the bounds reach the schema
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS), BeforeValidator(integral)]
TokenId = Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(integral)]  # below the vocabulary's size
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Seed = Annotated[int, Field(ge=0, le=INT64_MAX), BeforeValidator(integral)]
Choices = Annotated[int, Field(ge=1, le=10**6), BeforeValidator(integral)]  # at most the server's batch size
TopK = Annotated[int, Field(ge=-1, le=10**9), BeforeValidator(integral)]
Alternatives = Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS), BeforeValidator(integral)]
DraftLength = Annotated[int, Field(ge=0, le=MAX_SPECULATIVE_TOKENS), BeforeValidator(integral)]
Temperature = Annotated[float, Field(ge=0.0, le=2.0), BeforeValidator(finite)]
Probability = Annotated[float, Field(ge=0.0, le=1.0), BeforeValidator(finite)]
TopP = Annotated[float, Field(gt=0.0, le=1.0), BeforeValidator(finite)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0), BeforeValidator(finite)]
RepetitionPenalty = Annotated[float, Field(gt=0.0, le=100.0), BeforeValidator(finite)]
Bias = Annotated[float, Field(ge=-100.0, le=100.0), BeforeValidator(finite)]
LogitBias = Annotated[dict[Annotated[str, Field(pattern=r"^[0-9]+$")], Bias], Field(max_length=MAX_LOGIT_BIAS)]
AcceptanceRule = Annotated[StrictStr, Field(pattern=ACCEPTANCE_PATTERN)]


class Closed(BaseModel):
    """An object that refuses fields it does not name."""

    model_config = ConfigDict(extra="forbid")


class StreamOptions(Closed):
    include_usage: Boolean | None = None


class JsonSchemaFormat(Closed):
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: JsonSchemaObject | None = Field(None, alias="schema")
    strict: Boolean | None = None


class ResponseFormat(Closed):
    """{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}."""

    # checked when bound (binding.py), so that an unknown format is refused as the response_format it is
    type: StrictStr = Field(json_schema_extra={"enum": list(RESPONSE_FORMATS)})
    json_schema: JsonSchemaFormat | None = None


class Speculation(Closed):
    """specdec's extension: how this request drafts. {"enabled": false} drafts nothing."""

    enabled: Boolean | None = None
    drafter: StrictStr | None = Field(None, description="one of this server's drafters (default: the server's)")
    num_speculative_tokens: DraftLength | None = None
    sampling_verifier: Literal["auto", "rejection", "coupled"] | None = None  # speculation_config.SAMPLING_VERIFIERS
    adaptive: Boolean | None = None
    acceptance: AcceptanceRule | None = Field(
        None, description=f"{ACCEPTANCE_FORMS}; all but exact are LOSSY (default: the server's)"
    )


class GenerationBody(Closed):
    """The fields both generation endpoints take."""

    model: StrictStr = Field(description="one of this server's model names")
    max_tokens: MaxTokens | None = Field(None, description=FITS.format(of=""))
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: TopK | None = Field(None, description="0 or -1: off")
    min_p: Probability | None = None
    stop: Text | Annotated[list[Text], Field(max_length=MAX_STOPS)] | None = None
    seed: Seed | None = None
    stream: Boolean | None = None
    stream_options: StreamOptions | None = Field(None, description="only with stream: true")
    n: Choices | None = Field(None, description="at most the server's batch size")
    ignore_eos: Boolean | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: RepetitionPenalty | None = None
    logit_bias: LogitBias | None = Field(None, description="token id (below the vocabulary's size) -> bias")
    response_format: ResponseFormat | None = Field(
        None, description="at most one of response_format, guided_json, guided_regex, guided_grammar"
    )
    guided_json: JsonSchemaObject | StrictStr | None = None
    guided_regex: Text | None = None
    guided_grammar: Text | None = Field(None, description="a Lark grammar")
    speculation: Speculation | None = None
    # accepted and ignored
    user: Ignored = None
    metadata: Ignored = None
    store: Ignored = None
    service_tier: Ignored = None
    # accepted only at the value that changes nothing
    best_of: Annotated[Any, Neutral((1,))] = None
    suffix: Annotated[Any, Neutral(("",))] = None
    functions: Annotated[Any, Neutral(([],))] = None
    function_call: Annotated[Any, Neutral(("none",))] = None
    min_tokens: Annotated[Any, Neutral((0,))] = None
    modalities: Annotated[Any, Neutral((["text"],))] = None

    @model_validator(mode="before")
    @classmethod
    def _nulls_are_absent(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class CompletionsRequest(GenerationBody):
    """POST /v1/completions."""

    prompt: Text | TokenIds | Annotated[list[Text | TokenIds], Field(min_length=1, max_length=1)] = Field(
        description="one prompt: text or token ids (a batch of one is taken; send one prompt per request)"
    )
    logprobs: Alternatives | None = None
    echo: Boolean | None = None
    tools: Annotated[Any, Neutral(([],))] = None
    tool_choice: Annotated[Any, Neutral(("none",))] = None


class ContentPart(BaseModel):
    """A part of a message's content; only text parts are supported."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr
    text: StrictStr | None = None


def _text_only(parts: list[ContentPart]) -> list[ContentPart]:
    if not all(p.type == "text" and p.text is not None for p in parts):
        raise PydanticCustomError(
            "unsupported_parameter", "may only hold text parts, each with type 'text' and its text"
        )
    return parts


class FunctionCall(Closed):
    name: StrictStr
    arguments: StrictStr | dict[str, Any] = Field(description="a JSON object as text")


class ToolCall(BaseModel):
    """An earlier call in an assistant message."""

    id: StrictStr | None = None
    type: Literal["function"] | None = None
    function: FunctionCall


class ChatMessage(Closed):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: StrictStr | Annotated[list[ContentPart], Field(min_length=1), AfterValidator(_text_only)] | None = None
    name: StrictStr | None = None
    tool_calls: list[ToolCall] | None = Field(None, description="assistant messages only")
    tool_call_id: StrictStr | None = Field(None, description="tool messages: the call answered (required there)")


class FunctionDefinition(Closed):
    name: Annotated[StrictStr, Field(pattern=TOOL_NAME)]
    description: StrictStr = ""
    parameters: JsonSchemaObject | None = None
    strict: Boolean | None = None


class ToolDefinition(Closed):
    type: Literal["function"]
    function: FunctionDefinition

    @model_validator(mode="before")
    @classmethod
    def _a_function(cls, data: Any) -> Any:
        """A tool of another kind is refused as the tool it is (the only kind is a function)."""
        if not isinstance(data, dict) or data.get("type") != "function" or not isinstance(data.get("function"), dict):
            raise PydanticCustomError("invalid_value", 'must be {{"type": "function", "function": {{...}}}}')
        return data


class NamedFunction(Closed):
    name: Text


class NamedToolChoice(Closed):
    type: Literal["function"]
    function: NamedFunction


class ToolFields(Closed):
    """Function calling: the tools and how the answer may call them (tools.py)."""

    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = Field(
        None, description='"auto" needs the server\'s --tool-call-parser'
    )
    parallel_tool_calls: Boolean | None = None


class ChatRequest(GenerationBody, ToolFields):
    """POST /v1/chat/completions."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: MaxTokens | None = Field(None, description="takes precedence over max_tokens")
    logprobs: Boolean | None = None
    top_logprobs: Alternatives | None = Field(None, description="needs logprobs: true")
    echo: Annotated[Any, Neutral((False,))] = None
