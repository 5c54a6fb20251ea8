"""The server's OpenAPI document is FastAPI's, written from the protocol's models: every POST route shows its
request body, the ranges it shows are the ones the server enforces, the names and limits are this server's, and
bodies valid by the schema parse."""
import pytest

pytest.importorskip("fastapi")
hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from specdec.benchmarks.fuzz import fuzz_document  # noqa: E402
from specdec.server.document import openapi_document  # noqa: E402
from specdec.server.errors import APIError  # noqa: E402
from specdec.server.binding import parse_request  # noqa: E402
from specdec.server.schemas import Limits  # noqa: E402

LIMITS = Limits(model_names=("tiny", "tiny-alias"), drafters=("none", "ngram", "suffix"), default_drafter="ngram",
                vocab_size=50, max_choices=4, max_context=300)
BASE = {"chat": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        "completions": {"model": "tiny", "prompt": "hi"}}
SCHEMA = {"chat": "ChatRequest", "completions": "CompletionsRequest"}
CROSS_FIELD = {"top_logprobs": {"logprobs": True}, "stream_options": {"stream": True}}  # what each one needs
DOCUMENT = openapi_document(LIMITS, "test")


def _properties(endpoint: str) -> dict:
    return DOCUMENT["components"]["schemas"][SCHEMA[endpoint]]["properties"]


def test_the_document_is_valid_openapi_and_shows_every_request_body():
    schemathesis.openapi.from_dict(DOCUMENT).validate()
    posts = {path: ops["post"] for path, ops in DOCUMENT["paths"].items() if "post" in ops}
    assert set(posts) == {"/v1/completions", "/v1/chat/completions"}
    for path, post in posts.items():
        ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.rsplit("/", 1)[1] == SCHEMA["chat" if "chat" in path else "completions"]
        assert post["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"].endswith("ErrorResponse")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_values_at_the_edges_of_each_range_are_taken_and_beyond_them_refused(endpoint):
    checked = 0
    for name, spec in _properties(endpoint).items():
        if spec.get("type") not in ("integer", "number"):
            continue
        body = {**BASE[endpoint], **CROSS_FIELD.get(name, {})}
        step = 1 if spec["type"] == "integer" else 1e-6
        low = spec.get("minimum", spec.get("exclusiveMinimum"))
        inside = [spec["maximum"]] + ([low] if "minimum" in spec else [low + step])
        for value in inside:
            parse_request({**body, name: value}, endpoint, LIMITS)
        for value in (spec["maximum"] + step, low if "exclusiveMinimum" in spec else low - step):
            with pytest.raises(APIError) as caught:
                parse_request({**body, name: value}, endpoint, LIMITS)
            assert caught.value.status == 400 and caught.value.param == name, (name, value)
        checked += 1
    assert checked >= 11  # max_tokens, temperature, top_p, top_k, min_p, seed, n, three penalties, logprobs or top_logprobs


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_model_names_drafters_and_limits_are_this_servers(endpoint):
    props = _properties(endpoint)
    assert props["model"]["enum"] == ["tiny", "tiny-alias"]
    assert props["n"]["maximum"] == 4 and props["max_tokens"]["maximum"] == LIMITS.max_tokens
    drafter = DOCUMENT["components"]["schemas"]["Speculation"]["properties"]["drafter"]["anyOf"][0]
    assert drafter["enum"] == ["none", "ngram", "suffix"]
    with pytest.raises(APIError):
        parse_request({**BASE[endpoint], "n": 5}, endpoint, LIMITS)


def test_fields_accepted_only_at_a_neutral_value_say_so():
    props = _properties("completions")
    assert props["best_of"]["enum"] == [1] and props["tools"]["enum"] == [[]]
    assert _properties("chat")["echo"]["enum"] == [False]
    parse_request({**BASE["completions"], "best_of": 1.0}, "completions", LIMITS)
    for value in (2, True, "1"):
        with pytest.raises(APIError) as caught:
            parse_request({**BASE["completions"], "best_of": value}, "completions", LIMITS)
        assert caught.value.code == "unsupported_parameter" and caught.value.param == "best_of"


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _bodies(doc: dict, endpoint: str):
    """The request bodies schemathesis writes from `doc` as valid for `endpoint`."""
    from schemathesis import GenerationMode

    operation = schemathesis.openapi.from_dict(doc)[PATHS[endpoint]]["POST"]
    return operation.as_strategy(GenerationMode.POSITIVE).map(lambda case: case.body)


def _without_cross_field_rules(endpoint: str) -> dict:
    """The fuzzing document with only the fields no other field constrains: every body it allows must parse."""
    doc = fuzz_document(openapi_document(LIMITS, "test"))
    schema = doc["components"]["schemas"][SCHEMA[endpoint]]
    own = {"chat": "messages", "completions": "prompt"}[endpoint]
    kept = {name for name, spec in _properties(endpoint).items()
            if spec.get("type") in ("integer", "number", "boolean") and name not in CROSS_FIELD}
    schema["properties"] = {name: spec for name, spec in schema["properties"].items()
                            if name in kept or name in ("model", "stop", "speculation", own)}
    if endpoint == "chat":  # a tool message needs its call's id and tool_calls need a JSON text: said only in words
        message = schema["properties"]["messages"]["items"]
        message["properties"]["role"]["enum"] = ["system", "user", "assistant"]
        message["properties"]["content"] = {"type": "string"}  # only an assistant's call may come without text
        message["required"] = ["role", "content"]
        del message["properties"]["tool_calls"]
    return doc


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_bodies_valid_by_the_schema_parse(endpoint):
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_bodies(_without_cross_field_rules(endpoint), endpoint))
    def parses(body):
        parse_request(body, endpoint, LIMITS)

    parses()


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_any_body_the_full_schema_allows_is_parsed_or_refused_with_a_400(endpoint):
    @settings(max_examples=150, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(_bodies(fuzz_document(openapi_document(LIMITS, "test")), endpoint))
    def parsed_or_400(body):
        try:
            parse_request(body, endpoint, LIMITS)
        except APIError as exc:
            assert exc.status == 400

    parsed_or_400()
