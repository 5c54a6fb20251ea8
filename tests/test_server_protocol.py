"""The protocol's models are what a real server sends and takes: every answer (whole, streamed chunk by chunk, the
model list, an error) validates against the response models, which refuse fields they do not name; a body too
large is a 413 in OpenAI's format; pydantic's errors become OpenAI's, naming the field."""
import json

import httpx
import pytest

pytest.importorskip("fastapi")

from specdec.benchmarks.server_process import ServerProcess  # noqa: E402
from specdec.server.errors import APIError  # noqa: E402
from specdec.server.protocol_responses import (ChatCompletionChunk, ChatCompletionResponse,  # noqa: E402
                                               CompletionResponse, ErrorResponse, ModelList)
from specdec.server.binding import parse_request  # noqa: E402
from specdec.server.schemas import Limits  # noqa: E402
from specdec.server.state import ServerSettings  # noqa: E402
from tiny import write_tiny_model_folder  # noqa: E402

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "the cat"}], "max_tokens": 6, "ignore_eos": True}
TEXT = {"model": "tiny", "prompt": "the cat", "max_tokens": 6, "ignore_eos": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_tiny_model_folder(tmp_path_factory.mktemp("protocol") / "tiny", seed=0)
    with ServerProcess(["--model", str(folder), "--dtype", "float32", "--threads", "1", "--served-model-name",
                        "tiny", "--max-batch", "2"]) as s:
        yield s


def _events(response: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_whole_answers_are_the_response_models(server):
    chat = httpx.post(server.url + "/v1/chat/completions", json={**CHAT, "n": 2, "logprobs": True, "top_logprobs": 2},
                      timeout=60)
    assert chat.status_code == 200
    assert len(ChatCompletionResponse.model_validate(chat.json()).choices) == 2
    text = httpx.post(server.url + "/v1/completions", json={**TEXT, "logprobs": 2, "echo": True}, timeout=60)
    assert CompletionResponse.model_validate(text.json()).usage.completion_tokens == 6
    models = ModelList.model_validate(httpx.get(server.url + "/v1/models").json())
    assert "tiny" in [m.id for m in models.data]


def test_every_streamed_chunk_is_the_chunk_model(server):
    options = {"stream": True, "stream_options": {"include_usage": True}}
    chat = _events(httpx.post(server.url + "/v1/chat/completions", json={**CHAT, **options}, timeout=60))
    chunks = [ChatCompletionChunk.model_validate(event) for event in chat]
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-1].usage.completion_tokens == 6
    assert any(c.speculation is not None for c in chunks)  # the chunk that finishes the choice
    text = _events(httpx.post(server.url + "/v1/completions", json={**TEXT, **options}, timeout=60))
    assert "".join(CompletionResponse.model_validate(e).choices[0].text for e in text[:-1]) != ""


def test_the_models_refuse_what_they_do_not_name():
    """So that an answer that grows a field fails the tests above until the protocol declares it."""
    with pytest.raises(ValueError):
        ModelList.model_validate({"object": "list", "data": [], "extra": 1})


def test_errors_are_the_error_model_and_a_body_too_large_is_a_413(server):
    bad = httpx.post(server.url + "/v1/completions", json={**TEXT, "speculation": {"tree": True}})
    error = ErrorResponse.model_validate(bad.json()).error
    assert bad.status_code == 400 and error.param == "speculation.tree" and error.code == "unrecognized_argument"
    limit = ServerSettings.__dataclass_fields__["max_body_bytes"].default
    huge = httpx.post(server.url + "/v1/completions", json={**TEXT, "prompt": "x" * (limit + 1)}, timeout=60)
    assert huge.status_code == 413 and ErrorResponse.model_validate(huge.json()).error.code == "request_too_large"
    assert httpx.post(server.url + "/v1/completions", json=TEXT, timeout=60).status_code == 200  # still serving


LIMITS = Limits(model_names=("tiny",), drafters=("none", "ngram"), default_drafter="ngram", vocab_size=50)
CHAT_BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("change,param,code", [
    ({"messages": [{"role": "user", "content": "x", "colour": 1}]}, "messages[0].colour", "unrecognized_argument"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]}, "messages[0].content",
     "invalid_type"),
    ({"logit_bias": {"the": 1}}, "logit_bias", "invalid_value"),
    ({"logit_bias": {"7": "high"}}, "logit_bias", "invalid_type"),
    ({"max_tokens": 4.5}, "max_tokens", "invalid_type"),
    ({"max_tokens": True}, "max_tokens", "invalid_type"),
    ({"temperature": float("inf")}, "temperature", "invalid_type"),
    ({"stop": ["a", ""]}, "stop", "invalid_value"),
    ({"speculation": {"acceptance": "top-k:0"}}, "speculation.acceptance", "invalid_value"),
    ({"tool_choice": {"type": "function", "function": {}}}, "tool_choice", "missing_required_parameter"),
    ({"messages": None}, "messages", "missing_required_parameter"),
])
def test_a_refused_body_names_its_field_and_why(change, param, code):
    with pytest.raises(APIError) as caught:
        parse_request({**CHAT_BODY, **change}, "chat", LIMITS)
    error = caught.value
    assert (error.status, error.param, error.code) == (400, param, code), error.message
    assert error.message and "Traceback" not in error.message


def test_the_verifiers_a_request_may_name_are_the_engines():
    from typing import get_args

    from specdec.speculation_config import SAMPLING_VERIFIERS
    from specdec.server.protocol import Speculation

    assert set(get_args(get_args(Speculation.model_fields["sampling_verifier"].annotation)[0])) == \
        set(SAMPLING_VERIFIERS)


def test_nulls_are_fields_left_out_and_integral_numbers_are_integers():
    request = parse_request({**CHAT_BODY, "max_tokens": 4.0, "seed": None, "user": None, "frobnicate": None}, "chat",
                            LIMITS)
    assert request.config.max_new_tokens == 4 and request.config.sampling.seed is None
