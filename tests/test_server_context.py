"""`specdec serve --max-context N`: the KV pool holds N rows a slot, and N is the limit every request is held to
(a prompt that does not fit is a 400 naming N; a max_tokens given that does not fit with its prompt is refused, one
not given is clipped to the room left), and the server says N in /health, /v1/models and its OpenAPI document."""
import httpx
import pytest

pytest.importorskip("fastapi")

from specdec.errors import ConfigError  # noqa: E402
from specdec.benchmarks.server_process import ServerProcess  # noqa: E402

CONTEXT = 256  # the tiny model's own context is 512
WORDS = "the cat sat on a mat"


@pytest.fixture(scope="module")
def server(tiny_folder):
    args = ["--model", str(tiny_folder), "--dtype", "float32", "--threads", "1", "--served-model-name", "tiny",
            "--max-batch", "2", "--max-context", str(CONTEXT)]
    with ServerProcess(args) as s:
        yield s


def _prompt(tokens: int) -> str:
    """A prompt of `tokens` tokens for the tiny model's word-level tokenizer (which adds none of its own)."""
    words = WORDS.split()
    return " ".join(words[i % len(words)] for i in range(tokens))


def _post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": "tiny", **body}, timeout=60)


def test_the_server_states_its_context(server):
    assert httpx.get(server.url + "/health").json()["max_context"] == CONTEXT
    assert httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"] == CONTEXT
    schemas = httpx.get(server.url + "/openapi.json").json()["components"]["schemas"]
    for request, field in (("CompletionsRequest", "max_tokens"), ("ChatRequest", "max_completion_tokens")):
        spec = schemas[request]["properties"][field]
        assert spec["maximum"] == CONTEXT - 2 and str(CONTEXT) in spec["description"]


def test_a_prompt_longer_than_the_context_is_a_400_naming_it(server):
    for path, body in (("/v1/completions", {"prompt": _prompt(CONTEXT + 20)}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": _prompt(CONTEXT + 20)}]})):
        r = _post(server, path, body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["code"] == "context_length_exceeded" and f"context of {CONTEXT} tokens" in error["message"]


def test_max_tokens_given_is_refused_beyond_the_context_and_clipped_when_not_given(server):
    prompt = _prompt(CONTEXT - 40)
    refused = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 60})  # fits the model, not N
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert str(CONTEXT) in refused.json()["error"]["message"]
    beyond = _post(server, "/v1/completions", {"prompt": "the cat", "max_tokens": CONTEXT - 1})
    assert beyond.status_code == 400 and beyond.json()["error"]["param"] == "max_tokens"
    fits = _post(server, "/v1/completions", {"prompt": prompt, "max_tokens": 20, "ignore_eos": True})
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 20
    clipped = _post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                      "ignore_eos": True})  # the default 256 cut to the room left
    assert clipped.status_code == 200, clipped.text
    usage = clipped.json()["usage"]
    assert 0 < usage["completion_tokens"] < 40 and usage["prompt_tokens"] + usage["completion_tokens"] <= CONTEXT


def test_the_kv_pool_holds_the_context_and_no_more(tiny_folder):
    from specdec.server.loading import load_decoder

    decoder = load_decoder(str(tiny_folder), slots=3, drafter="none", dtype="float32", backend="torch",
                           max_context=CONTEXT)
    pool = decoder.target.backend.pool
    assert pool.capacity == CONTEXT and pool.keys.shape[1] == 3 and decoder.target.info.max_context == CONTEXT
    with pytest.raises(ConfigError, match="beyond the model's context of 512"):
        load_decoder(str(tiny_folder), slots=1, drafter="none", dtype="float32", backend="torch", max_context=1024)
