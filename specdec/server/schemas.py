"""What the server makes of a request: its limits (Limits), a validated and bound request (GenerationRequest, with
the SpeculationChoice it asks for), as binding.py builds them from the protocol's models (protocol.py) and the
worker and handlers read them."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import GenerationConfig
from .protocol import MAX_TOKENS
from .tools import ToolCalling


@dataclass(frozen=True)
class Limits:
    """What the server accepts: the names it answers to, the drafters a request may pick, defaults."""

    model_names: tuple[str, ...]
    # "none", "ngram", "suffix", "recycle", shipped heads ("eagle", "eagle3", "medusa"), "select", the server's own
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
    prompt: list[dict] | str | list[int]  # chat: [{"role", "content": str}]; completions: a string or token ids
    config: GenerationConfig
    max_tokens_given: bool  # False: config.max_new_tokens is a default, clipped to the context left
    speculation: SpeculationChoice
    stream: bool
    include_usage: bool
    n: int = 1  # choices: engine requests over the same prompt
    echo: bool = False  # completions: the prompt comes back before the completion (with its logprobs if asked for)
    tool_calling: ToolCalling | None = None  # chat with tools: the tools and how the answer may call them
