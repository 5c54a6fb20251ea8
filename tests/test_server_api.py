"""`specdec serve` in a real process: the official openai client, 16 parallel streams that equal each
request served alone, per-request speculation, mid-stream disconnects, metrics, and bench-serve."""
import json
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from specdec.engine import SpecDecoder  # noqa: E402
from specdec.models.loading import load_model  # noqa: E402
from specdec.server.process import ServerProcess  # noqa: E402
from tiny import WORDS, write_tiny_model_folder  # noqa: E402

KEY = "sk-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    # hidden 64: shapes the CPU kernels take, whose float32 forward is batch-invariant
    return write_tiny_model_folder(tmp_path_factory.mktemp("serve") / "tiny64", seed=0, hidden=64)


@pytest.fixture(scope="module")
def server(folder):
    args = ["--model", str(folder), "--dtype", "float32", "--threads", "1", "--served-model-name", "tiny",
            "--max-batch", "16"]
    with ServerProcess(args, env={"SPECDEC_API_KEY": KEY}) as s:  # the key from the environment
        yield s


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def local(folder):
    target = load_model(str(folder), dtype="float32")
    return SpecDecoder(target, None), SpecDecoder(target, None, chat=False)


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    return sum(float(v) for v in re.findall(rf"^{re.escape(name)} (\S+)$", text, re.M))


def prompt(i: int, n: int = 6) -> str:
    return " ".join(WORDS[(7 * i + 3 * j) % len(WORDS)] for j in range(n + i % 5))


def test_chat_and_completions_streaming_and_not_give_the_models_greedy_text(client, local):
    chat_decoder, raw_decoder = local
    messages = [{"role": "system", "content": "the sky"}, {"role": "user", "content": "the cat sat on the mat"}]
    want = chat_decoder.generate(messages, max_new_tokens=20, temperature=0.0)
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(want.prompt_ids) and got.usage.completion_tokens == len(want.token_ids)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == want.finish_reason

    want = raw_decoder.generate("a big red dog", max_new_tokens=15, temperature=0.0, ignore_eos=True)
    got = client.completions.create(model="tiny", prompt="a big red dog", max_tokens=15, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 15
    chunks = list(client.completions.create(model="tiny", prompt="a big red dog", max_tokens=15, temperature=0,
                                            stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks) == want.text


def test_a_conversation_reuses_its_earlier_turns_from_the_prefix_cache(client, server, local):
    """The prefix cache (on by default): a turn's prompt holds the earlier turns, whose cached keys and values it
    reuses (usage.prompt_tokens_details.cached_tokens, and the Prometheus counter); its answer is the model's
    greedy answer all the same."""
    chat_decoder, _ = local
    messages = [{"role": "system", "content": prompt(3, 20)}, {"role": "user", "content": prompt(4, 12)}]
    before = metric(server, "specdec_prefix_cache_hit_tokens_total")
    first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": prompt(5, 8)}]
    want = chat_decoder.generate(messages, max_new_tokens=12, temperature=0.0)
    second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    assert second.choices[0].message.content == want.text
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens <= cached < second.usage.prompt_tokens
    assert metric(server, "specdec_prefix_cache_hit_tokens_total") - before >= cached


def test_usage_reports_each_requests_own_speculation(client):
    def run(speculation):
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "the dog ran to the dog ran to the"}], max_tokens=30,
            temperature=0, stream=True, stream_options={"include_usage": True},
            extra_body={"speculation": speculation, "ignore_eos": True})
        chunks = list(stream)
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 30
        return chunks, chunks[-1].usage.model_extra["speculation"]

    chunks, off = run({"enabled": False})
    assert off["drafter"] == "none" and off["drafted_tokens"] == 0 and off["verify_steps"] == 29
    assert off["mean_accepted_tokens"] == 1.0 and off["acceptance_rate"] is None
    assert off["drafting_steps"] == 0 and off["mean_acceptance_length"] is None
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish[0].model_extra["speculation"] == off  # also on the chunk that carries finish_reason
    _, on = run({"drafter": "ngram", "num_speculative_tokens": 3})
    assert on["drafter"] == "ngram" and on["num_speculative_tokens"] == 3
    assert 0 <= on["accepted_tokens"] <= on["drafted_tokens"] <= 3 * on["drafting_steps"]
    assert on["drafting_steps"] <= on["verify_steps"]
    if on["drafting_steps"]:
        assert on["mean_acceptance_length"] == 1 + on["accepted_tokens"] / on["drafting_steps"]
    # drafting every step (adaptive off for these requests): whether it pays depends on this machine's speeds
    run({"drafter": "suffix", "adaptive": False})
    _, again = run({"drafter": "suffix", "adaptive": False})  # drafted from the first answer, held by the index
    assert again["drafter"] == "suffix" and again["accepted_tokens"] > 0
    # per step, ngram or suffix (no heads for this model) or none, by the speeds measured on this machine
    _, chosen = run({"drafter": "select"})
    steps = chosen.get("drafter_steps", {})
    assert chosen["drafter"] == "select" and set(steps) <= {"ngram", "suffix"}
    assert sum(steps.values()) <= chosen["verify_steps"] and chosen["accepted_tokens"] <= chosen["drafted_tokens"]
    assert "drafter_steps" not in again
    got = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0)
    assert set(got.usage.model_extra["speculation"]) >= {"drafted_tokens", "accepted_tokens", "acceptance_rate",
                                                         "mean_accepted_tokens"}


def _requests():
    """16 different requests: chat and completions, several lengths and speculation settings."""
    specs = [None, {"enabled": False}, {"drafter": "ngram", "num_speculative_tokens": 2}, {"drafter": "none"},
             {"drafter": "suffix"}, {"drafter": "select"}]
    out = []
    for i in range(16):
        extra = {"ignore_eos": i % 3 != 0}
        if specs[i % 6] is not None:
            extra["speculation"] = specs[i % 6]
        out.append(dict(kind="chat" if i % 2 else "completions", text=prompt(i), max_tokens=40 + 4 * i, extra=extra))
    return out


def _stream_text(url: str, req: dict, barrier: threading.Barrier | None = None) -> tuple[str, str]:
    c = openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0)
    if barrier is not None:
        barrier.wait()  # all clients ready: the requests arrive together
    common = dict(model="tiny", max_tokens=req["max_tokens"], temperature=0, stream=True, extra_body=req["extra"])
    if req["kind"] == "chat":
        chunks = list(c.chat.completions.create(messages=[{"role": "user", "content": req["text"]}], **common))
        return "".join(x.choices[0].delta.content or "" for x in chunks), chunks[-1].choices[0].finish_reason
    chunks = list(c.completions.create(prompt=req["text"], **common))
    return "".join(x.choices[0].text for x in chunks), chunks[-1].choices[0].finish_reason


def test_sixteen_parallel_streams_each_equal_the_request_served_alone(server):
    requests = _requests()
    alone = [_stream_text(server.url, r) for r in requests]
    single_steps = metric(server, "specdec_step_batch_size_count")
    singles = metric(server, 'specdec_step_batch_size_bucket{le="1.0"}')
    barrier = threading.Barrier(len(requests))
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: _stream_text(server.url, r, barrier), requests))
    assert together == alone
    assert all(text for text, _ in alone)
    steps = metric(server, "specdec_step_batch_size_count") - single_steps
    batched = steps - (metric(server, 'specdec_step_batch_size_bucket{le="1.0"}') - singles)
    assert batched > steps / 2, "most steps should have decoded several sequences in one pass"


@pytest.mark.parametrize("n", [1, 4])
def test_a_client_that_disconnects_mid_stream_frees_its_slots(server, n):
    """Hanging up cancels the request, every one of its n choices, and frees their batch slots at once."""
    cancelled = metric(server, 'specdec_finished_sequences_total{reason="cancelled"}')
    gone = metric(server, 'specdec_requests_total{endpoint="/v1/completions",status="499"}')
    generated = metric(server, "specdec_generation_tokens_total")
    body = {"model": "tiny", "prompt": "the", "max_tokens": 480, "temperature": 0, "stream": True, "n": n,
            "ignore_eos": True, "speculation": {"enabled": False}}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data: "))  # one chunk, then hang up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = httpx.get(server.url + "/health").json()
        if health["running"] == 0 and health["inflight"] == 0:
            break
        time.sleep(0.02)
    assert health["free_slots"] == health["max_batch"] == 16
    assert metric(server, 'specdec_finished_sequences_total{reason="cancelled"}') == cancelled + n
    assert metric(server, 'specdec_requests_total{endpoint="/v1/completions",status="499"}') == gone + 1
    assert metric(server, "specdec_generation_tokens_total") - generated < 480 * n


def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data][0] == "tiny"
    for _ in range(2):  # the second is drafted from the first's answer (suffix index): the metrics have samples
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "the cat sat"}],
                                       max_tokens=20, temperature=0,
                                       extra_body={"speculation": {"drafter": "suffix", "adaptive": False}})
    health = httpx.get(server.url + "/health").json()  # no key needed
    assert health["status"] == "ok" and health["drafter"] == "quantized"  # auto: the 4-bit copy, where the kernels run
    text = httpx.get(server.url + "/metrics", headers=AUTH).text
    for name in ("specdec_requests_total", "specdec_prompt_tokens_total", "specdec_generation_tokens_total",
                 "specdec_draft_tokens_total", "specdec_accepted_tokens_total", "specdec_acceptance_rate",
                 "specdec_mean_accepted_tokens", "specdec_drafting_steps_total",
                 "specdec_mean_acceptance_length", "specdec_time_to_first_token_seconds_bucket",
                 "specdec_request_latency_seconds_bucket", "specdec_queue_depth", "specdec_running_batch_size",
                 "process_resident_memory_bytes"):
        assert re.search(rf"^{name}[ {{]", text, re.M), name
    # per draft position (as vLLM exports them): the positions sum to the totals
    for kind in ("draft", "accepted"):
        per = re.findall(rf'^specdec_{kind}_tokens_per_position_total{{position="(\d+)"}} (\S+)$', text, re.M)
        assert per and {p for p, _ in per} >= {"0"}
        assert sum(float(v) for _, v in per) == metric(server, f"specdec_{kind}_tokens_total") > 0


def test_bench_serve_against_the_running_server(server, tmp_path, capsys):
    from specdec.cli.main import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": f"c{i % 2}", "turns": [prompt(i)]}) + "\n"
                               for i in range(4)))
    out, report = tmp_path / "bench.json", tmp_path / "bench.md"
    rc = main(["bench-serve", "--url", server.url, "--api-key", KEY, "--prompts", str(prompts), "--max-tokens", "8",
               "--concurrency", "1,4", "--rounds", "2", "--out-json", str(out), "--report", str(report)])
    assert rc == 0
    summary = json.loads(out.read_text())
    assert [(r["concurrency"], r["round"], r["speculation"]) for r in summary["runs"]] == [
        (1, 1, "off"), (1, 1, "on"), (1, 2, "on"), (1, 2, "off"), (4, 1, "off"), (4, 1, "on"), (4, 2, "on"),
        (4, 2, "off")]
    assert all(r["ok"] == 4 and r["failed"] == r["lost"] == 0 and r["tokens_per_s"] > 0 for r in summary["runs"])
    assert summary["floors"]["lost_or_failed"] == 0 and "| concurrency |" in report.read_text()
    assert {"speculation_on_over_off_c1", "speculation_on_over_off_c4"} <= set(summary["floors"])


def test_serving_floors_pool_repeated_runs():
    """Rounds of one (concurrency, speculation) count as one run: their tokens over their seconds."""
    from specdec.server.loadgen import floors

    def run(c, mode, tokens, wall, latency):
        return {"concurrency": c, "speculation": mode, "completion_tokens": tokens, "wall_s": wall, "ok": 4,
                "failed": 0, "lost": 0, "latency_s": {"mean": latency}}

    runs = [run(1, "off", 100, 10.0, 2.0), run(1, "on", 100, 5.0, 1.0), run(1, "on", 100, 15.0, 3.0),
            run(1, "off", 100, 10.0, 2.0), run(4, "off", 400, 10.0, 2.0), run(4, "on", 400, 8.0, 1.5)]
    got = floors(runs)
    assert got["speculation_on_over_off_c1"] == 1.0  # 200 tokens in 20 s either way
    assert got["speculation_on_over_off_c4"] == 1.25
    assert got["latency_speedup_c1_speculation"] == 1.0
    assert got["throughput_scaling_c4_over_c1_no_speculation"] == 4.0 and got["lost_or_failed"] == 0


def test_stop_strings_and_seeds(client, local):
    _, raw_decoder = local
    full = raw_decoder.generate("a big red dog", max_new_tokens=30, temperature=0.0, ignore_eos=True).text
    stop = " ".join(full.split()[3:5])
    want = raw_decoder.generate("a big red dog", max_new_tokens=30, temperature=0.0, ignore_eos=True, stop=[stop])
    for stream in (False, True):
        got = client.completions.create(model="tiny", prompt="a big red dog", max_tokens=30, temperature=0, stop=stop,
                                        stream=stream, extra_body={"ignore_eos": True})
        chunks = list(got) if stream else [got]
        assert "".join(c.choices[0].text for c in chunks) == want.text == full[: full.index(stop)]
        assert chunks[-1].choices[0].finish_reason == "stop"
    sampled = [client.completions.create(model="tiny", prompt="the sun", max_tokens=20, temperature=0.9, top_p=0.9,
                                         seed=7, extra_body={"top_k": 20}).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]


def test_penalties_and_logit_bias(client, local):
    """OpenAI's presence and frequency penalties and logit_bias, and vLLM's repetition_penalty and min_p, reach the
    sampler chain: the text equals the engine's for the same request."""
    _, raw_decoder = local
    penalties = dict(presence_penalty=0.8, frequency_penalty=0.6)
    extra = dict(repetition_penalty=1.3, min_p=0.05, ignore_eos=True)
    want = raw_decoder.generate("the cat sat on the mat", max_new_tokens=20, temperature=0.0, **penalties, **extra)
    plain = raw_decoder.generate("the cat sat on the mat", max_new_tokens=20, temperature=0.0, ignore_eos=True)
    assert want.text != plain.text
    got = client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=20, temperature=0,
                                    **penalties, extra_body=extra)
    assert got.choices[0].text == want.text
    word = raw_decoder.target.tokenizer.convert_tokens_to_ids("moon")
    got = client.completions.create(model="tiny", prompt="the cat", max_tokens=5, temperature=0,
                                    logit_bias={str(word): 100}, extra_body={"ignore_eos": True})
    assert got.choices[0].text.split() == ["moon"] * 5


def test_logprobs_are_the_engines_streamed_or_not(client, local):
    """Chat (`logprobs`, `top_logprobs`) and completions (`logprobs`) return each token's logprob and the most
    likely alternatives: those the engine computes for the same request, in OpenAI's two formats, whether streamed
    or not, with the server's drafter on."""
    chat_decoder, raw_decoder = local
    tokenizer = raw_decoder.target.tokenizer
    messages = [{"role": "user", "content": "the cat sat on the mat"}]
    want = chat_decoder.generate(messages, max_new_tokens=12, temperature=0.0, logprobs=3)
    got = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0, logprobs=True,
                                         top_logprobs=3)
    content = got.choices[0].logprobs.content
    assert [c.token for c in content] == [tokenizer.decode([t.token_id]) for t in want.logprobs]
    assert [c.logprob for c in content] == pytest.approx([t.logprob for t in want.logprobs], abs=1e-5)
    for c, w in zip(content, want.logprobs):
        assert [a.token for a in c.top_logprobs] == [tokenizer.decode([i]) for i, _ in w.top]
        assert c.top_logprobs[0].logprob >= c.top_logprobs[1].logprob >= c.top_logprobs[2].logprob
        assert c.bytes == list(c.token.encode())
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                 logprobs=True, top_logprobs=3, stream=True))
    streamed = [c for ch in chunks if ch.choices and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content]

    want = raw_decoder.generate("a big red dog", max_new_tokens=10, temperature=0.0, ignore_eos=True, logprobs=2)
    for stream in (False, True):
        got = client.completions.create(model="tiny", prompt="a big red dog", max_tokens=10, temperature=0, logprobs=2,
                                        stream=stream, extra_body={"ignore_eos": True})
        parts = [c.choices[0].logprobs for c in (list(got) if stream else [got]) if c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        assert tokens == [tokenizer.decode([t.token_id]) for t in want.logprobs]
        assert [lp for p in parts for lp in p.token_logprobs] == pytest.approx([t.logprob for t in want.logprobs],
                                                                               abs=1e-5)
        assert [len(top) for p in parts for top in p.top_logprobs] == [2] * 10
        offsets = [o for p in parts for o in p.text_offset]
        assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(10)]
    plain = client.completions.create(model="tiny", prompt="a big red dog", max_tokens=3)
    assert plain.choices[0].logprobs is None


def test_n_choices_each_equal_the_request_sent_alone_with_its_seed(client):
    """`n` choices run as n engine requests over one prompt: with a seed, choice i is the request sent alone with
    seed + i; usage counts the prompt once and every choice's completion; streamed, every chunk names its choice."""
    # drafting off: with rejection sampling a sample depends on how many tokens were drafted, which the adaptive
    # policy decides from measured times (coupled verification would make them seed-stable)
    common = dict(model="tiny", prompt="the cat sat on", max_tokens=8, temperature=0.9,
                  extra_body={"ignore_eos": True, "speculation": {"enabled": False}})
    got = client.completions.create(n=3, seed=11, **common)
    assert [c.index for c in got.choices] == [0, 1, 2]
    alone = [client.completions.create(seed=11 + i, **common).choices[0].text for i in range(3)]
    assert [c.text for c in got.choices] == alone
    assert len(set(alone)) > 1, "three samples at temperature 0.9 should not all agree"
    assert got.usage.completion_tokens == 24 and got.usage.prompt_tokens == client.completions.create(
        seed=1, **common).usage.prompt_tokens
    assert got.usage.model_extra["speculation"]["verify_steps"] >= 3

    chunks = list(client.completions.create(n=3, seed=11, stream=True, stream_options={"include_usage": True},
                                            **common))
    texts, finished = ["", "", ""], set()
    for c in chunks[:-1]:
        texts[c.choices[0].index] += c.choices[0].text
        if c.choices[0].finish_reason:
            finished.add(c.choices[0].index)
    assert texts == alone and finished == {0, 1, 2}
    assert chunks[-1].usage.completion_tokens == 24

    messages = [{"role": "user", "content": "the dog ran"}]
    chat = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, n=2,
                                               stream=True))
    roles = [c.choices[0].index for c in chat if c.choices[0].delta.role == "assistant"]
    replies = ["", ""]
    for c in chat:
        replies[c.choices[0].index] += c.choices[0].delta.content or ""
    assert roles == [0, 1] and replies[0] == replies[1] != ""  # greedy: both choices are the same text
    whole = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0, n=2)
    assert [c.message.content for c in whole.choices] == replies


def test_echo_returns_the_prompt_and_its_logprobs(client, local):
    """`echo` with `logprobs` (how evaluation harnesses score text through a server): the prompt comes back before
    the completion, and its tokens' logprobs (the first one has none) before the completion's."""
    _, raw_decoder = local
    tokenizer = raw_decoder.target.tokenizer
    want = raw_decoder.generate("the cat sat on the mat", max_new_tokens=2, temperature=0.0, ignore_eos=True,
                                logprobs=1, prompt_logprobs=1)
    for stream in (False, True):
        got = client.completions.create(model="tiny", prompt="the cat sat on the mat", max_tokens=2, temperature=0,
                                        logprobs=1, echo=True, stream=stream, extra_body={"ignore_eos": True})
        chunks = list(got) if stream else [got]
        assert "".join(c.choices[0].text for c in chunks) == "the cat sat on the mat" + want.text
        parts = [c.choices[0].logprobs for c in chunks if c.choices[0].logprobs]
        tokens = [t for p in parts for t in p.tokens]
        logprobs = [lp for p in parts for lp in p.token_logprobs]
        entries = want.prompt_logprobs + want.logprobs
        assert tokens == [tokenizer.decode([e.token_id]) for e in entries]
        assert logprobs[0] is None and logprobs[1:] == pytest.approx([e.logprob for e in entries[1:]], abs=1e-5)
        assert [p for p in parts for p in p.top_logprobs][0] is None
    plain = client.completions.create(model="tiny", prompt="the cat", max_tokens=2, temperature=0, echo=True)
    assert plain.choices[0].text.startswith("the cat") and plain.choices[0].logprobs is None
