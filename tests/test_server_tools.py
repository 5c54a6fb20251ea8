"""Function calling on the server: required and named calls are constrained (always well-formed and valid against
the tool's schema, streamed or not, the same text as constrained decoding of the rendered prompt); "auto" reads
calls from the text with a parser; conversations carry earlier calls and tool results; bad tool fields are 400s."""
import json

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

import httpx  # noqa: E402

from specdec.engine import SpecDecoder  # noqa: E402
from specdec.models.loading import load_model  # noqa: E402
from specdec.benchmarks.server_process import ServerProcess  # noqa: E402
from specdec.server.tools import ToolCalling, parse_tool_calling  # noqa: E402

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["paris", "rome"]},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 9}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["utc", "cet"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "the weather in paris"}]
NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.fixture(scope="module")
def server(tiny_bpe_folder):
    with ServerProcess(["--model", str(tiny_bpe_folder), "--dtype", "float32", "--threads", "1",
                        "--served-model-name", "tiny"]) as s:
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def _valid_weather(arguments: str) -> bool:
    args = json.loads(arguments)
    return set(args) == {"city", "days"} and args["city"] in ("paris", "rome") and 1 <= args["days"] <= 9


def _streamed_calls(chunks) -> tuple[list[dict], str]:
    """Tool calls put together from streamed deltas, as the openai client's users do; and the finish_reason."""
    calls, reason = {}, None
    for c in chunks:
        choice = c.choices[0]
        reason = choice.finish_reason or reason
        for d in choice.delta.tool_calls or []:
            call = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
            call["id"] = d.id or call["id"]
            call["name"] = (d.function.name if d.function and d.function.name else None) or call["name"]
            call["arguments"] += (d.function.arguments or "") if d.function else ""
    return [calls[i] for i in sorted(calls)], reason


def test_a_named_call_is_constrained_to_the_tools_schema(client, tiny_bpe_folder):
    got = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice=NAMED,
                                         max_tokens=40, temperature=0)
    choice = got.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert _valid_weather(call.function.arguments)
    # the arguments are constrained decoding of the prompt with the tools written into the system message
    calling = ToolCalling(parse_tool_calling({"tools": [WEATHER], "tool_choice": NAMED}, None, None).tools, "function",
                          "get_weather")
    messages, _ = calling.messages(MESSAGES, template_takes_tools=False)
    want = SpecDecoder(load_model(str(tiny_bpe_folder), dtype="float32"), None).generate(
        messages, max_new_tokens=40, json_schema=WEATHER["function"]["parameters"])
    assert call.function.arguments == want.text
    streamed, reason = _streamed_calls(client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=[WEATHER], tool_choice=NAMED, max_tokens=40, temperature=0,
        stream=True))
    assert reason == "tool_calls" and len(streamed) == 1
    assert streamed[0]["name"] == "get_weather" and streamed[0]["arguments"] == want.text


@pytest.mark.parametrize("parallel", [None, False])
@pytest.mark.parametrize("stream", [False, True])
def test_a_required_call_picks_one_of_the_tools_with_valid_arguments(client, stream, parallel):
    """Parallel calls are allowed unless parallel_tool_calls is false: then the answer is exactly one call, here
    sampled. This random model may go on adding calls past max_tokens when sampling, and sampled text depends on
    the drafting schedule (lossless, not seed-stable, under rejection sampling): the parallel case is greedy."""
    sampling = dict(temperature=0) if parallel is None else dict(temperature=0.8, seed=5, parallel_tool_calls=False)
    kwargs = dict(model="tiny", messages=MESSAGES, tools=[WEATHER, TIME], tool_choice="required", max_tokens=76,
                  **sampling)
    if stream:
        calls, reason = _streamed_calls(client.chat.completions.create(**kwargs, stream=True))
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        calls = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                 for c in choice.message.tool_calls or []]
        reason = choice.finish_reason
    assert reason == "tool_calls" and len(calls) >= 1
    assert len(calls) == 1 or parallel is None
    assert len({c["id"] for c in calls}) == len(calls) and all(c["id"].startswith("call_") for c in calls)
    for call in calls:
        args = json.loads(call["arguments"])
        if call["name"] == "get_weather":
            assert _valid_weather(call["arguments"])
        else:
            assert call["name"] == "get_time" and args in ({"zone": "utc"}, {"zone": "cet"})


def test_parallel_required_calls_are_a_json_array_of_calls():
    calling = parse_tool_calling({"tools": [WEATHER, TIME], "tool_choice": "required"}, None, None)
    text = '[{"name": "get_time", "arguments": {"zone": "utc"}}, {"name": "get_weather", "arguments": ' \
           '{"city": "rome", "days": 2}}]'
    content, calls, reason = calling.answer(text, "stop")
    assert content is None and reason == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_time", {"zone": "utc"}), ("get_weather", {"city": "rome", "days": 2})]
    single = parse_tool_calling({"tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": False},
                                None, None)
    assert json.loads(calling.constraint().text)["type"] == "array" and "anyOf" in json.loads(single.constraint().text)
    content, calls, _ = single.answer('{"name": "get_time", "arguments": {"zone": "cet"}}', "stop")
    assert [c["function"]["name"] for c in calls] == ["get_time"]


def test_a_conversation_carries_earlier_calls_and_tool_results(client, tiny_bpe_folder):
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "paris", "days": 1}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    got = client.chat.completions.create(model="tiny", messages=messages, tools=[WEATHER], tool_choice="none",
                                         max_tokens=8, temperature=0)
    assert isinstance(got.choices[0].message.content, str) and not got.choices[0].message.tool_calls
    assert got.choices[0].finish_reason in ("stop", "length")
    without_tools = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    # without tools the history is still written out, as text, for a template that knows nothing of calls
    call = json.dumps({"name": "get_weather", "arguments": {"city": "paris", "days": 1}})
    as_text = MESSAGES + [{"role": "assistant", "content": f"<tool_call>\n{call}\n</tool_call>"},
                          {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}]
    encoded = SpecDecoder(load_model(str(tiny_bpe_folder), dtype="float32"), None).encode(as_text)
    assert without_tools.usage.prompt_tokens == len(encoded)


def test_auto_reads_hermes_calls_from_the_text():
    calling = parse_tool_calling({"tools": [WEATHER, TIME]}, "hermes", None)
    assert calling.choice == "auto" and calling.constraint() is None
    content, calls, reason = calling.answer(
        'Let me check.\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "utc"}}\n</tool_call>', "stop")
    assert content == "Let me check." and reason == "tool_calls"
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_time",
                                                                                                  {"zone": "utc"})]
    two = '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><tool_call>{"name": "get_weather"}</tool_call>'
    assert [c["function"]["name"] for c in calling.answer(two, "stop")[1]] == ["get_time", "get_weather"]
    one = parse_tool_calling({"tools": [WEATHER, TIME], "parallel_tool_calls": False}, "hermes", None)
    assert [c["function"]["name"] for c in one.answer(two, "stop")[1]] == ["get_time"]
    assert calling.answer("<tool_call>{not json}</tool_call> plain", "stop") == (
        "<tool_call>{not json}</tool_call> plain", [], "stop")
    assert calling.answer("just text", "length") == ("just text", [], "length")
    named = parse_tool_calling({"tools": [TIME], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
                               None, None)
    assert named.answer('{"zone": "ut', "stop") == ('{"zone": "ut', [], "stop")  # a stop string cut the call short
    assert named.answer('{"zone": "utc"}', "stop")[2] == "tool_calls"


def test_auto_streams_text_until_a_call_opens_then_sends_the_call():
    """Streamed "auto": content flows as generated, except a tail that may be opening <tool_call> (held back), and
    what follows the tag becomes the call at the end."""
    from specdec.metrics import GenerationMetrics
    from specdec.server.generation import _ToolCallStream
    from specdec.server.responses import Meta
    from specdec.server.events import Delta, Finished

    def run(pieces, reason="stop"):
        stream = _ToolCallStream(Meta(chat=True, model="m"), parse_tool_calling({"tools": [TIME]}, "hermes", None), 1)
        out = []
        for piece in pieces:
            out += [c["choices"][0] for c in stream.events(0, Delta(piece, 1))]
        out += [c["choices"][0] for c in stream.events(0, Finished(reason, 3, 9, GenerationMetrics(), "ngram", 4))]
        return out

    chunks = run(["Sure, ", "checking <tool", '_call>{"name": "get_time", ', '"arguments": {"zone": "cet"}}</tool_call>'])
    assert [c["delta"].get("content") for c in chunks[:2]] == ["Sure, ", "checking "]  # "<tool" held back
    (call,) = chunks[2]["delta"]["tool_calls"]
    assert call["index"] == 0 and call["function"] == {"name": "get_time", "arguments": '{"zone": "cet"}'}
    assert chunks[-1]["finish_reason"] == "tool_calls" and len(chunks) == 4
    chunks = run(["a < b and <tool", "box>"], reason="length")  # a held-back tail that was not a tag
    assert "".join(c["delta"].get("content") or "" for c in chunks) == "a < b and <toolbox>"
    assert chunks[-1]["finish_reason"] == "length"


def test_tools_reach_a_chat_template_that_takes_them(tiny_bpe_folder):
    target = load_model(str(tiny_bpe_folder), dtype="float32")
    target.tokenizer.chat_template = ("{% for t in tools %}[{{ t['function']['name'] }}]{% endfor %}"
                                      "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}")
    calling = parse_tool_calling({"tools": [WEATHER], "tool_choice": "required"}, None, None)
    messages, tools = calling.messages(MESSAGES, template_takes_tools=True)
    assert messages == MESSAGES and [t["function"]["name"] for t in tools] == ["get_weather"]
    text = target.tokenizer.decode(SpecDecoder(target, None).encode(messages, tools=tools))
    assert text.startswith("[get_weather]")


@pytest.mark.parametrize("body,param", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "tools[1].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"a": {"type": "nonsense"}}}}}], "tool_choice": "required"}, "tools"),
    ({"tools": [WEATHER]}, "tool_choice"),  # "auto" without --tool-call-parser
    ({"tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "tool_choice": "required", "logprobs": True}, "logprobs"),
    ({"tools": [WEATHER], "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "tool_choice"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1"}}]}]},
     "messages[0].tool_calls[0]"),
])
def test_bad_tool_fields_are_a_400_naming_the_field(server, body, param):
    r = httpx.post(server.url + "/v1/chat/completions", json={"model": "tiny", "messages": MESSAGES, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
