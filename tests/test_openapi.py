"""The server's OpenAPI document says what the request parser accepts: the same fields, the same ranges, and
bodies valid by the schema parse."""
import pytest

pytest.importorskip("fastapi")
hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402

from specdec.benchmarks.fuzz import fuzz_document  # noqa: E402
from specdec.server.errors import APIError  # noqa: E402
from specdec.server.openapi import document, request_schema  # noqa: E402
from specdec.server.schemas import FIELDS, IGNORED, NEUTRAL, Limits, parse_request  # noqa: E402

LIMITS = Limits(model_names=("tiny", "tiny-alias"), drafters=("none", "ngram", "suffix"), default_drafter="ngram",
                vocab_size=50, max_choices=4)
BASE = {"chat": {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]},
        "completions": {"model": "tiny", "prompt": "hi"}}
CROSS_FIELD = {"top_logprobs": {"logprobs": True}, "stream_options": {"stream": True}}  # what each one needs


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_the_schema_names_exactly_the_fields_the_parser_takes(endpoint):
    properties = set(request_schema(endpoint, LIMITS)["properties"])
    assert properties == FIELDS[endpoint] | IGNORED | (set(NEUTRAL) - FIELDS[endpoint])


def test_the_document_is_valid_openapi():
    schemathesis.openapi.from_dict(document(LIMITS, "test")).validate()


def _ranges(endpoint):
    for name, spec in request_schema(endpoint, LIMITS)["properties"].items():
        if spec.get("type") in ("integer", "number"):
            yield name, spec


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_values_at_the_edges_of_each_range_are_taken_and_beyond_them_refused(endpoint):
    checked = 0
    for name, spec in _ranges(endpoint):
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
def test_model_names_and_drafters_are_this_servers(endpoint):
    props = request_schema(endpoint, LIMITS)["properties"]
    assert props["model"]["enum"] == ["tiny", "tiny-alias"]
    assert props["speculation"]["properties"]["drafter"]["enum"] == ["none", "ngram", "suffix"]
    assert props["n"]["maximum"] == 4
    with pytest.raises(APIError):
        parse_request({**BASE[endpoint], "n": 5}, endpoint, LIMITS)


PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


def _bodies(doc: dict, endpoint: str):
    """The request bodies schemathesis writes from `doc` as valid for `endpoint`."""
    from schemathesis import GenerationMode

    operation = schemathesis.openapi.from_dict(doc)[PATHS[endpoint]]["POST"]
    return operation.as_strategy(GenerationMode.POSITIVE).map(lambda case: case.body)


def _without_cross_field_rules(endpoint: str) -> dict:
    """The fuzzing document with only the fields no other field constrains: every body it allows must parse."""
    doc = fuzz_document(document(LIMITS, "test"))
    schema = doc["components"]["schemas"]["ChatRequest" if endpoint == "chat" else "CompletionsRequest"]
    own = {"chat": "messages", "completions": "prompt"}[endpoint]
    schema["properties"] = {name: spec for name, spec in schema["properties"].items()
                            if spec.get("type") in ("integer", "number", "boolean") and name not in CROSS_FIELD
                            or name in ("model", "stop", "speculation", own)}
    if endpoint == "chat":  # a tool message needs its call's id and tool_calls need a JSON text: said only in words
        message = schema["properties"]["messages"]["items"]
        message["properties"]["role"]["enum"] = ["system", "user", "assistant"]
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
    @given(_bodies(fuzz_document(document(LIMITS, "test")), endpoint))
    def parsed_or_400(body):
        try:
            parse_request(body, endpoint, LIMITS)
        except APIError as exc:
            assert exc.status == 400

    parsed_or_400()
