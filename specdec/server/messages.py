"""Chat messages and completion prompts of a request body, checked and put in the form the chat template and the
tokenizer take (roles mapped to the template's, text parts joined, earlier tool calls' arguments decoded)."""
from __future__ import annotations

import json

from .errors import bad_request, unsupported
from .fields import integral

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


def parse_messages(value) -> list[dict]:
    """`messages` -> [{"role", "content": str, ...}] with the chat template's roles (developer -> system); an
    assistant message's earlier tool calls and a tool message's call id are kept."""
    if value is None:
        raise bad_request("'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(value, list) or not value:
        raise bad_request("'messages' must be a non-empty array of messages", "messages", "invalid_type")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_request(f"'{where}' must be an object with 'role' and 'content'", where, "invalid_type")
        for key in message:
            if key not in ("role", "content", "name", "tool_calls", "tool_call_id"):
                raise unsupported(f"{where}.{key}")
        role = message.get("role")
        if role not in ROLES:
            raise bad_request(f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role",
                              "invalid_value")
        calls = _tool_calls(message.get("tool_calls"), where) if role == "assistant" else None
        if message.get("tool_calls") is not None and role != "assistant":
            raise unsupported(f"{where}.tool_calls", "is only allowed on assistant messages")
        content = "" if calls and message.get("content") is None else _content(message.get("content"),
                                                                                f"{where}.content")
        item = {"role": ROLES[role], "content": content}
        if calls:
            item["tool_calls"] = calls
        if role == "tool":
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"'{where}.tool_call_id' must be the id of the call this message answers",
                                  f"{where}.tool_call_id", "missing_required_parameter")
            item["tool_call_id"] = call_id
        out.append(item)
    return out


def _tool_calls(value, where: str) -> list[dict] | None:
    """An assistant message's earlier calls, their arguments decoded (chat templates take them as objects)."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise bad_request(f"'{where}.tool_calls' must be an array", f"{where}.tool_calls", "invalid_type")
    out = []
    for j, call in enumerate(value):
        fn = call.get("function") if isinstance(call, dict) else None
        try:
            arguments = json.loads(fn["arguments"]) if isinstance(fn.get("arguments"), str) else fn["arguments"]
            if not isinstance(fn["name"], str) or not isinstance(arguments, dict):
                raise TypeError
        except (TypeError, KeyError, AttributeError, ValueError):
            raise bad_request(f"'{where}.tool_calls[{j}]' must be {{\"id\", \"type\": \"function\", \"function\": "
                              "{\"name\", \"arguments\": a JSON object as text}}", f"{where}.tool_calls[{j}]",
                              "invalid_value") from None
        out.append({"id": str(call.get("id", "")), "type": "function",
                    "function": {"name": fn["name"], "arguments": arguments}})
    return out


def _content(value, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        texts = [part.get("text") for part in value if isinstance(part, dict) and part.get("type") == "text"]
        if len(texts) == len(value) and all(isinstance(t, str) for t in texts):
            return "".join(texts)
        raise unsupported(where, "may only hold text parts ({'type': 'text', 'text': ...})")
    raise bad_request(f"'{where}' must be a string or an array of text parts", where, "invalid_type")


def parse_prompt(value, vocab_size: int):
    """`prompt`: a string or a list of token ids; a batch of one is unwrapped, larger batches are refused."""
    if value is None:
        raise bad_request("'prompt' is required", "prompt", "missing_required_parameter")
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise bad_request("'prompt' is empty", "prompt", "invalid_value")
        return value
    if isinstance(value, list) and value and all(integral(t) for t in value):
        if not all(0 <= t < vocab_size for t in value):
            raise bad_request(f"token ids in 'prompt' must be in [0, {vocab_size})", "prompt", "invalid_value")
        return [int(t) for t in value]
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise unsupported("prompt", "holds several prompts; send one prompt per request")
    raise bad_request("'prompt' must be a string or an array of token ids", "prompt", "invalid_type")
