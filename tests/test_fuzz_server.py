"""Fuzzing the server: hundreds of requests hypothesis writes, valid, invalid and hostile, against a real server
process; every answer is a 2xx in OpenAI's shape or a 4xx OpenAI error, never a 5xx or a hang, and the server
keeps serving. (`specdec bench-serve --fuzz N` runs thousands.)"""
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("hypothesis")

from specdec.bench.fuzz import FuzzRequest, fuzz, problem  # noqa: E402
from specdec.server.process import ServerProcess  # noqa: E402
from tiny import write_tiny_model_folder  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = write_tiny_model_folder(tmp_path_factory.mktemp("fuzz") / "tiny", seed=0)
    args = ["--model", str(folder), "--dtype", "float32", "--threads", "1", "--served-model-name", "tiny",
            "--max-batch", "4"]
    with ServerProcess(args) as s:
        yield s


def test_hundreds_of_fuzzed_requests_get_only_2xx_or_4xx_answers(server):
    report = fuzz(server.url, "tiny", count=300, seed=1, timeout=60, stop_at_first=True)
    assert report.requests == 300 and not report.problems, report.problems
    assert report.by_status.get("2xx", 0) > 30 and report.by_status.get("4xx", 0) > 30  # both kinds exercised


def test_the_checks_catch_what_they_are_for():
    """The oracle itself: a 5xx, a 4xx without an error object, a stream without [DONE], or no answer fail."""
    post = FuzzRequest("POST", "/v1/completions", b"{}")
    assert problem(post, 500, "application/json", b'{"error": {"message": "x", "type": "server_error"}}')
    assert problem(post, 400, "application/json", b"Bad request")
    assert problem(post, 200, "text/event-stream", b'data: {"choices": []}\n\n')
    assert problem(post, None, "", b"")
    assert problem(post, 200, "application/json", b'{"object": "text_completion"}')
    assert problem(post, 400, "application/json", b'{"error": {"message": "bad", "type": "invalid_request_error"}}') \
        is None
    good = b'{"object": "text_completion", "choices": [{"finish_reason": "length"}], "usage": {}}'
    assert problem(post, 200, "application/json", good) is None
