"""Bad requests get OpenAI-format errors with the right status and type, never a traceback, and the
server keeps serving; the API key is enforced (not on /health); a full queue answers 429."""
import asyncio

import httpx
import pytest

pytest.importorskip("fastapi")

from specdec.benchmarks.server_process import ServerProcess  # noqa: E402
from tiny import write_tiny_model_folder  # noqa: E402

KEY = "sk-flag-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
OK = {"model": "tiny", "prompt": "the cat", "max_tokens": 4}
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "the cat"}], "max_tokens": 4}
LONG = " ".join(["the cat sat"] * 200)  # 600 tokens; the tiny model's context is 512
BAD = "invalid_request_error"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_tiny_model_folder(tmp_path_factory.mktemp("serve") / "tiny", seed=0)
    args = ["--model", str(folder), "--dtype", "float32", "--threads", "1", "--served-model-name", "tiny",
            "--api-key", KEY, "--max-batch", "1", "--max-queue", "0"]
    with ServerProcess(args) as s:
        yield s


CASES = [  # (path, body: dict merged into a valid one, or raw bytes; status, error type, param)
    ("/v1/completions", b"{not json", 400, BAD, None),
    ("/v1/completions", b"\xff\xfe", 400, BAD, None),
    ("/v1/completions", b"[1, 2]", 400, BAD, None),
    ("/v1/completions", {"model": None}, 400, BAD, "model"),
    ("/v1/completions", {"model": "gpt-4o"}, 404, BAD, "model"),
    ("/v1/completions", {"model": 7}, 400, BAD, "model"),
    ("/v1/completions", {"prompt": None}, 400, BAD, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, BAD, "prompt"),
    ("/v1/completions", {"prompt": 12}, 400, BAD, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, BAD, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, 400, BAD, "prompt"),
    ("/v1/completions", {"prompt": LONG}, 400, BAD, "prompt"),
    ("/v1/completions", {"max_tokens": 10_000}, 400, BAD, "max_tokens"),  # beyond any prompt's room: refused at once
    ("/v1/completions", {"max_tokens": 505}, 400, BAD, "prompt"),  # with this prompt and the drafts
    ("/v1/completions", {"max_tokens": 0}, 400, BAD, "max_tokens"),
    ("/v1/completions", {"max_tokens": "8"}, 400, BAD, "max_tokens"),
    ("/v1/completions", {"max_tokens": 2.5}, 400, BAD, "max_tokens"),
    ("/v1/completions", {"temperature": -0.1}, 400, BAD, "temperature"),
    ("/v1/completions", {"temperature": 2.5}, 400, BAD, "temperature"),
    ("/v1/completions", {"temperature": "hot"}, 400, BAD, "temperature"),
    ("/v1/completions", {"top_p": 0}, 400, BAD, "top_p"),
    ("/v1/completions", {"top_p": 1.5}, 400, BAD, "top_p"),
    ("/v1/completions", {"top_k": -2}, 400, BAD, "top_k"),
    ("/v1/completions", {"seed": -1}, 400, BAD, "seed"),
    ("/v1/completions", {"n": 17}, 400, BAD, "n"),
    ("/v1/completions", {"n": 0}, 400, BAD, "n"),
    ("/v1/completions", {"n": "2"}, 400, BAD, "n"),
    ("/v1/completions", {"stop": [""]}, 400, BAD, "stop"),
    ("/v1/completions", {"stop": 5}, 400, BAD, "stop"),
    ("/v1/completions", {"stop": ["x"] * 17}, 400, BAD, "stop"),
    ("/v1/completions", {"stream": "yes"}, 400, BAD, "stream"),
    ("/v1/completions", {"stream_options": {"include_usage": True}}, 400, BAD, "stream_options"),
    ("/v1/completions", {"stream": True, "stream_options": {"include_usage": 1}}, 400, BAD,
     "stream_options.include_usage"),
    ("/v1/completions", {"presence_penalty": 2.5}, 400, BAD, "presence_penalty"),
    ("/v1/completions", {"frequency_penalty": "high"}, 400, BAD, "frequency_penalty"),
    ("/v1/completions", {"repetition_penalty": 0}, 400, BAD, "repetition_penalty"),
    ("/v1/completions", {"min_p": 1.5}, 400, BAD, "min_p"),
    ("/v1/completions", {"logit_bias": [1, 2]}, 400, BAD, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"the": 5}}, 400, BAD, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"100000": 5}}, 400, BAD, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"3": 150}}, 400, BAD, "logit_bias"),
    ("/v1/completions", {"logprobs": 21}, 400, BAD, "logprobs"),
    ("/v1/completions", {"logprobs": True}, 400, BAD, "logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, 400, BAD, "top_logprobs"),
    ("/v1/chat/completions", {"echo": True}, 400, BAD, "echo"),
    ("/v1/completions", {"echo": "yes"}, 400, BAD, "echo"),
    ("/v1/completions", {"best_of": 3}, 400, BAD, "best_of"),
    ("/v1/completions", {"messages": []}, 400, BAD, "messages"),
    ("/v1/completions", {"frobnicate": 1}, 400, BAD, "frobnicate"),
    ("/v1/completions", {"speculation": "on"}, 400, BAD, "speculation"),
    ("/v1/completions", {"speculation": {"drafter": "telepathy"}}, 400, BAD, "speculation.drafter"),
    ("/v1/completions", {"speculation": {"num_speculative_tokens": 65}}, 400, BAD, "speculation.num_speculative_tokens"),
    ("/v1/completions", {"speculation": {"enabled": "no"}}, 400, BAD, "speculation.enabled"),
    ("/v1/completions", {"speculation": {"tree": True}}, 400, BAD, "speculation.tree"),
    ("/v1/completions", {"speculation": {"sampling_verifier": "lenient"}}, 400, BAD, "speculation.sampling_verifier"),
    ("/v1/completions", {"speculation": {"adaptive": "no"}}, 400, BAD, "speculation.adaptive"),
    ("/v1/chat/completions", {"messages": None}, 400, BAD, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, BAD, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, BAD, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, 400, BAD, "messages[0].role"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, BAD, "messages[0].tool_call_id"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, BAD, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     400, BAD, "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": LONG}]}, 400, BAD, "messages"),
    ("/v1/chat/completions", {"max_completion_tokens": 0}, 400, BAD, "max_completion_tokens"),
    ("/v1/chat/completions", {"logprobs": 3}, 400, BAD, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, 400, BAD, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, 400, BAD, "top_logprobs"),
    ("/v1/chat/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, BAD,
     "tool_choice"),  # "auto" without --tool-call-parser
    ("/v1/completions", {"tools": [{"type": "function", "function": {"name": "f"}}]}, 400, BAD, "tools"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, 400, BAD, "response_format"),  # word-level tokenizer
    ("/v1/completions", {"guided_regex": "[a-"}, 400, BAD, "guided_regex"),
    ("/v1/completions", {"response_format": {"type": "yaml"}}, 400, BAD, "response_format"),
    ("/v1/chat/completions", {"prompt": "x"}, 400, BAD, "prompt"),
    ("/v1/nothing", {}, 404, BAD, None),
]


@pytest.mark.parametrize("path,body,status,kind,param", CASES)
def test_bad_input_gets_an_openai_error(server, path, body, status, kind, param):
    base = CHAT if "chat" in path else OK
    content = body if isinstance(body, bytes) else httpx.Request("POST", "/", json={**base, **body}).content
    r = httpx.post(server.url + path, content=content, headers={**AUTH, "Content-Type": "application/json"}, timeout=30)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == kind and error["param"] == param
    assert "Traceback" not in r.text


def test_the_server_still_serves_after_bad_input(server):
    r = httpx.post(server.url + "/v1/completions", json=OK, headers=AUTH, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    r = httpx.get(server.url + "/v1/completions", headers=AUTH)
    assert r.status_code == 405 and r.json()["error"]["type"] == BAD


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}])
def test_the_api_key_is_required_except_for_health(server, headers):
    for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/metrics")):
        r = httpx.request(method, server.url + path, json=OK, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(server.url + "/health", headers=headers).status_code == 200


def test_a_full_server_answers_429_and_recovers(server):
    async def scenario():
        async with httpx.AsyncClient(base_url=server.url, headers=AUTH, timeout=30) as c:
            long = {**OK, "max_tokens": 500, "ignore_eos": True, "stream": True, "speculation": {"enabled": False}}
            async with c.stream("POST", "/v1/completions", json=long) as first:  # holds the only place
                assert first.status_code == 200
                second = await c.post("/v1/completions", json=OK)
                async for _ in first.aiter_lines():
                    pass
            third = await c.post("/v1/completions", json=OK)
            return second, third

    second, third = asyncio.run(scenario())
    assert second.status_code == 429 and second.json()["error"]["type"] == "rate_limit_error"
    assert int(second.headers["retry-after"]) >= 1
    assert third.status_code == 200


def test_retry_after_follows_the_rate_places_come_free():
    """A 429's Retry-After is how long the places asked for take to come free at the recent rate: a server
    finishing a request every 4 s tells a client of one choice 4 s and one of three 12 s; 1 s until it can tell,
    and at most 60 s."""
    from collections import deque

    from specdec.server.state import ServerState

    state = ServerState.__new__(ServerState)  # admission alone: no worker or model needed
    state.freed = deque(maxlen=64)
    assert state.retry_after_s(1, now=100.0) == 1
    state.freed.extend([(60.0, 1), (64.0, 1), (68.0, 1), (72.0, 1)])  # four places in 16 s to now
    assert state.retry_after_s(1, now=76.0) == 4 and state.retry_after_s(3, now=76.0) == 12
    assert state.retry_after_s(1, now=72.0 + 121.0) == 1  # releases older than two minutes tell nothing
    state.freed = deque([(0.0, 1), (100.0, 1)])
    assert state.retry_after_s(4, now=110.0) == 60
