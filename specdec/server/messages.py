"""Chat messages and completion prompts, validated by the protocol's models (protocol.py), put in the form the chat
template and the tokenizer take: roles mapped to the template's, text parts joined, earlier tool calls' arguments
decoded; what the schema cannot say (a tool message names its call, token ids below the vocabulary's size) is a
400 here."""

from __future__ import annotations

import json

from .errors import bad_request, unsupported
from .protocol import ChatMessage, ToolCall

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(messages: list[ChatMessage]) -> list[dict]:
    """-> [{"role", "content": str, ...}] with the chat template's roles (developer -> system); an assistant
    message's earlier tool calls and a tool message's call id are kept."""
    out = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if message.tool_calls is not None and message.role != "assistant":
            raise unsupported(f"{where}.tool_calls", "is only allowed on assistant messages")
        calls = _tool_calls(message.tool_calls, where) if message.role == "assistant" else None
        if message.content is None and not calls:
            raise bad_request(
                f"'{where}.content' must be a string or an array of text parts", f"{where}.content", "invalid_type"
            )
        content = (
            message.content
            if isinstance(message.content, str)
            else "".join(part.text or "" for part in message.content or [])
        )
        item: dict = {"role": ROLES[message.role], "content": content}
        if calls:
            item["tool_calls"] = calls
        if message.role == "tool":
            if message.tool_call_id is None:
                raise bad_request(
                    f"'{where}.tool_call_id' must be the id of the call this message answers",
                    f"{where}.tool_call_id",
                    "missing_required_parameter",
                )
            item["tool_call_id"] = message.tool_call_id
        out.append(item)
    return out


def _tool_calls(calls: list[ToolCall] | None, where: str) -> list[dict] | None:
    """An assistant message's earlier calls, their arguments decoded (chat templates take them as objects)."""
    if calls is None:
        return None
    out = []
    for j, call in enumerate(calls):
        given = call.function.arguments
        try:
            arguments = json.loads(given) if isinstance(given, str) else given
        except ValueError:
            arguments = None
        if not isinstance(arguments, dict):
            raise bad_request(
                f"'{where}.tool_calls[{j}].function.arguments' must be a JSON object as text",
                f"{where}.tool_calls[{j}]",
                "invalid_value",
            )
        out.append(
            {"id": call.id or "", "type": "function", "function": {"name": call.function.name, "arguments": arguments}}
        )
    return out


def parse_prompt(value: str | list, vocab_size: int) -> str | list[int]:
    """A completion's prompt: a string or token ids (below the vocabulary's size); a batch of one is unwrapped."""
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        return value
    if not all(t < vocab_size for t in value):
        raise bad_request(f"token ids in 'prompt' must be in [0, {vocab_size})", "prompt", "invalid_value")
    return list(value)
