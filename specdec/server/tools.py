"""Function calling (OpenAI's `tools` and `tool_choice` on chat completions).

- `tool_choice` "required", or {"type": "function", "function": {"name": N}}: the answer is constrained to a call
  (structured output, specdec/structured.py): for a named function, its arguments object (the function's
  `parameters` schema); for "required", {"name": one of the tools, "arguments": that tool's parameters}, or, as
  parallel calls are allowed unless the request sends `parallel_tool_calls: false`, a JSON array of one or more
  such calls (as vLLM constrains them). A call is
  then always well-formed and valid against its schema, speculation stays lossless (drafts are masked as in any
  constrained request) and the keys and punctuation the schema forces are drafted for free.
- "auto" (OpenAI's default when tools are given): the model decides, and its text is parsed for calls in the
  format it was trained to write them in (`specdec serve --tool-call-parser hermes`: <tool_call>{"name": ...,
  "arguments": {...}}</tool_call>, as Hermes, Qwen and many others write them), as vLLM does. Without a parser
  "auto" is refused with a 400 that says what to send instead.
- "none": the model sees the tools and answers in text.

The tools reach the model through its chat template when the template takes `tools`; otherwise their
descriptions are added to the system message, and earlier calls and tool results are written as text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from ..config import Constraint
from ..errors import ConfigError
from ..structured import check

from .errors import bad_request, unsupported
from .protocol import ToolFields
from .validation import validated

PARSERS = ("hermes",)
CALL_TAG = "<tool_call>"  # how a hermes call opens
HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters_json: str  # the arguments' JSON schema, as JSON text (hashable)

    @property
    def parameters(self) -> dict:
        return json.loads(self.parameters_json)

    def openai(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


@dataclass(frozen=True)
class ToolCalling:
    """A request's tools and how it may call them: choice "none", "auto", "required" or "function" (the one
    named by `function`)."""

    tools: tuple[Tool, ...]
    choice: str
    function: str | None = None
    parser: str | None = None
    parallel: bool = True  # several calls in one answer ("required" and "auto"; OpenAI's parallel_tool_calls)

    @property
    def calls(self) -> bool:
        """Whether the answer may be a call (and is parsed as one)."""
        return self.choice != "none"

    def constraint(self) -> Constraint | None:
        """The structured-output constraint that makes the answer a call ("required" and named choices)."""
        if self.choice == "function":
            return Constraint.json_schema(next(t for t in self.tools if t.name == self.function).parameters)
        if self.choice == "required":
            call = {
                "anyOf": [
                    {
                        "type": "object",
                        "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                        "required": ["name", "arguments"],
                        "additionalProperties": False,
                    }
                    for t in self.tools
                ]
            }
            return Constraint.json_schema({"type": "array", "minItems": 1, "items": call} if self.parallel else call)
        return None

    def answer(self, text: str, finish_reason: str) -> tuple[str | None, list[dict], str]:
        """(content, tool calls in OpenAI's format, finish_reason) for a generated text. A call cut short (by the
        length limit or a stop string) stays text."""
        if self.choice in ("function", "required"):
            try:  # the constraint made it valid JSON unless the length limit or a stop string cut it short
                call = json.loads(text) if finish_reason != "length" else None
            except ValueError:
                call = None
            if call is None:
                return text, [], finish_reason
            if self.choice == "function":
                return None, [tool_call(self.function or "", text)], "tool_calls"
            return (
                None,
                [tool_call(c["name"], _dumps(c["arguments"])) for c in (call if isinstance(call, list) else [call])],
                "tool_calls",
            )
        if self.choice == "auto":
            calls = []
            for block in HERMES_CALL.findall(text):
                try:
                    call = json.loads(block)
                    if (
                        isinstance(call, dict)
                        and isinstance(call.get("name"), str)
                        and isinstance(call.get("arguments", {}), dict)
                    ):
                        calls.append(tool_call(call["name"], _dumps(call.get("arguments", {}))))
                except ValueError:
                    pass
            if calls:
                content = HERMES_CALL.sub("", text).strip()
                return content or None, calls if self.parallel else calls[:1], "tool_calls"
        return text, [], finish_reason

    def messages(self, messages: list[dict], template_takes_tools: bool) -> tuple[list[dict], list[dict] | None]:
        """(messages, tools) for the chat template: the tools as the template takes them, or written into the
        system message for one that does not (with earlier calls and results as text)."""
        if template_takes_tools:
            return messages, [t.openai() for t in self.tools]
        described = "\n".join(
            json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters}) for t in self.tools
        )
        how = {
            "none": "Answer in text; do not call a function.",
            "auto": 'To call a function, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>.',
            "required": "Answer with a JSON array of one or more function calls."
            if self.parallel
            else "Answer with a function call.",
            "function": f"Answer with a call to {self.function}.",
        }
        note = (
            f"You can call these functions (name, description, JSON schema of the arguments):\n{described}\n"
            f"{how[self.choice]}"
        )
        out = [as_text(m) for m in messages]
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{note}"}
        else:
            out.insert(0, {"role": "system", "content": note})
        return out, None


def parse_tool_calling(
    request: ToolFields | dict, parser: str | None, structured_error: str | None
) -> ToolCalling | None:
    """A chat request's tools and tool_choice (protocol.ToolFields, a ChatRequest's, or a dict of those fields
    alone, validated here); None when it gives no tools. Raises APIError (400)."""
    if isinstance(request, dict):
        request = validated(ToolFields, request)
    tools, given = request.tools, request.tool_choice
    if not tools:
        if given not in (None, "none"):
            raise bad_request("'tool_choice' is only allowed when 'tools' are given", "tool_choice", "invalid_value")
        return None
    parsed = _tools(tools)
    names = [t.name for t in parsed]
    function = None
    if given is None:
        choice = "auto"
    elif isinstance(given, str):
        choice = given
    else:  # a named function
        function = given.function.name
        if function not in names:
            raise bad_request(
                '\'tool_choice\' must name one of the tools, {"type": "function", "function": '
                f'{{"name": ...}}}}, with a name among {", ".join(names)}',
                "tool_choice",
                "invalid_value",
            )
        choice = "function"
    if choice == "auto" and parser is None:
        raise unsupported(
            "tool_choice",
            '"auto" (the default when tools are given) needs the server started with '
            "--tool-call-parser (the format this model writes calls in); send "
            '"required" or a named function, which specdec enforces by constrained '
            'decoding, or "none"',
        )
    if choice in ("required", "function") and structured_error:
        raise bad_request(
            f"tool calls are not available for this model: {structured_error}", "tool_choice", "unsupported_parameter"
        )
    if choice in ("required", "function") and any(
        getattr(request, k, None) is not None
        for k in ("response_format", "guided_json", "guided_regex", "guided_grammar")
    ):
        raise bad_request(
            "a required or named tool call constrains the answer already: send it without response_format or guided_*",
            "tool_choice",
            "invalid_value",
        )
    parallel = request.parallel_tool_calls is not False
    calling = ToolCalling(parsed, choice, function, parser, parallel)
    if (constraint := calling.constraint()) is not None:
        try:
            check(constraint)  # compiled here, so that a bad parameters schema is a 400
        except ConfigError as exc:
            raise bad_request(
                f"a tool's parameters are not a usable JSON schema: {exc}", "tools", "invalid_value"
            ) from None
    return calling


def _tools(tools) -> tuple[Tool, ...]:
    """protocol.Tool definitions -> Tools; names unique, parameters a JSON schema of an object."""
    out, seen = [], set()
    for i, tool in enumerate(tools):
        where, fn = f"tools[{i}]", tool.function
        parameters = fn.parameters if fn.parameters is not None else NO_PARAMETERS
        if fn.name in seen:
            raise bad_request(f"two tools are named {fn.name!r}", f"{where}.function.name", "invalid_value")
        if parameters.get("type", "object") != "object":
            raise bad_request(
                f"'{where}.function.parameters' must be a JSON schema of an object",
                f"{where}.function.parameters",
                "invalid_value",
            )
        seen.add(fn.name)
        out.append(Tool(fn.name, fn.description, json.dumps(parameters, sort_keys=True)))
    return tuple(out)


def tool_call(name: str, arguments: str) -> dict:
    """A call in OpenAI's format, with a fresh id."""
    return {
        "id": "call_" + uuid.uuid4().hex[:24],
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _dumps(arguments) -> str:
    return json.dumps(arguments, ensure_ascii=False)


def as_text(message: dict) -> dict:
    """A message for a chat template without tools: earlier calls and tool results written as text."""
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    if message.get("tool_calls"):
        calls = "\n".join(f"<tool_call>\n{json.dumps(c['function'])}\n</tool_call>" for c in message["tool_calls"])
        return {"role": "assistant", "content": f"{message.get('content') or ''}\n{calls}".strip()}
    return {"role": message["role"], "content": message["content"]}
