"""`specdec serve` under concurrent clients: 16 parallel streams each equal the request served alone and were
decoded mostly in shared steps; a client that hangs up mid-stream cancels its request and frees its slots at once."""
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from served import AUTH, KEY, metric, prompt  # noqa: E402


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


def test_sixteen_parallel_streams_each_equal_the_request_served_alone(openai_server):
    requests = _requests()
    alone = [_stream_text(openai_server.url, r) for r in requests]
    rows_before = metric(openai_server, "specdec_step_batch_size_sum")  # sequences decoded, summed over steps
    singles = metric(openai_server, 'specdec_step_batch_size_bucket{le="1.0"}')
    barrier = threading.Barrier(len(requests))
    with ThreadPoolExecutor(len(requests)) as pool:
        together = list(pool.map(lambda r: _stream_text(openai_server.url, r, barrier), requests))
    assert together == alone
    assert all(text for text, _ in alone)
    rows = metric(openai_server, "specdec_step_batch_size_sum") - rows_before
    alone_rows = metric(openai_server, 'specdec_step_batch_size_bucket{le="1.0"}') - singles
    # counted by sequence, not by step: the longest requests' last steps run alone however the requests arrive,
    # and a busy machine spreads their arrival
    assert rows - alone_rows > rows / 2, "most sequences' steps should have shared a pass with others"


@pytest.mark.parametrize("n", [1, 4])
def test_a_client_that_disconnects_mid_stream_frees_its_slots(openai_server, n):
    """Hanging up cancels the request, every one of its n choices, and frees their batch slots at once."""
    cancelled = metric(openai_server, 'specdec_finished_sequences_total{reason="cancelled"}')
    gone = metric(openai_server, 'specdec_requests_total{endpoint="/v1/completions",status="499"}')
    generated = metric(openai_server, "specdec_generation_tokens_total")
    body = {"model": "tiny", "prompt": "the", "max_tokens": 480, "temperature": 0, "stream": True, "n": n,
            "ignore_eos": True, "speculation": {"enabled": False}}
    with httpx.stream("POST", openai_server.url + "/v1/completions", json=body, headers=AUTH, timeout=30) as r:
        assert r.status_code == 200
        next(line for line in r.iter_lines() if line.startswith("data: "))  # one chunk, then hang up
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        health = httpx.get(openai_server.url + "/health").json()
        if health["running"] == 0 and health["inflight"] == 0:
            break
        time.sleep(0.02)
    assert health["free_slots"] == health["max_batch"] == 16
    assert metric(openai_server, 'specdec_finished_sequences_total{reason="cancelled"}') == cancelled + n
    assert metric(openai_server, 'specdec_requests_total{endpoint="/v1/completions",status="499"}') == gone + 1
    assert metric(openai_server, "specdec_generation_tokens_total") - generated < 480 * n
