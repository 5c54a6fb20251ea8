"""A request's prompt as the token ids the engine prefills: token ids as given, a completion's text through the
tokenizer, a chat's messages (and tools) through the model's chat template."""

from __future__ import annotations

from typing import cast

from ..errors import SpecdecError
from .errors import bad_request
from .schemas import GenerationRequest
from .tools import as_text


def prompt_ids(decoder, request: GenerationRequest) -> list[int]:
    """The prompt's token ids; a prompt the tokenizer or chat template refuses is a 400 naming the field."""
    if isinstance(request.prompt, list) and request.endpoint == "completions":
        return list(cast("list[int]", request.prompt))  # token ids
    tokenizer = decoder.target.tokenizer
    try:
        if request.endpoint == "chat":  # through the chat template; a chat's prompt is its messages
            messages = cast("list[dict]", request.prompt)
            takes_tools = "tools" in (tokenizer.chat_template or "")
            if request.tool_calling is not None:
                messages, tools = request.tool_calling.messages(messages, takes_tools)
                return decoder.encode(messages, tools=tools)
            # earlier calls and tool results, for a template that knows nothing of them, as text
            return decoder.encode(messages if takes_tools else [as_text(m) for m in messages])
        return tokenizer(request.prompt, add_special_tokens=True)["input_ids"]
    except SpecdecError:
        raise
    except Exception as exc:  # e.g. a chat template that refuses this conversation
        raise bad_request(
            f"could not tokenize the prompt: {exc}", "messages" if request.endpoint == "chat" else "prompt"
        ) from None
