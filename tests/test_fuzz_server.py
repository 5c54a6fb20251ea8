"""Fuzzing the server: hundreds of requests hypothesis writes, valid, invalid and hostile, against a real server
process; every answer is a 2xx in OpenAI's shape or a 4xx OpenAI error, never a 5xx or a hang, and the server
keeps serving. (`specdec bench-serve --fuzz N` runs thousands.) A seed writes the same requests in every run, so
that a new edge case fails a change that brings it, not a later run that happens to draw it."""
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("hypothesis")
httpx = pytest.importorskip("httpx")

from specdec.benchmarks.fuzz import FuzzRequest, digest, drawn, fuzz, problem  # noqa: E402
from specdec.server.document import openapi_document  # noqa: E402
from specdec.server.schemas import Limits  # noqa: E402
from specdec.benchmarks.server_process import ServerProcess  # noqa: E402
from hypothesis_constants import fixed_constants  # noqa: E402
from tiny import write_tiny_model_folder  # noqa: E402


@pytest.fixture(autouse=True)
def pinned_constants():
    """Every draw in these tests from hypothesis' own constants (tests/hypothesis_constants.py)."""
    with fixed_constants():
        yield


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
    served = httpx.get(server.url + "/openapi.json").json()
    assert report.as_dict()["requests_digest"] == digest(drawn(served, 300, seed=1))  # what it drew, and no more
    assert report.by_status.get("2xx", 0) > 30 and report.by_status.get("4xx", 0) > 30  # both kinds exercised


DRAW = """
import sys
sys.path.insert(0, sys.argv[2])
for module in sys.argv[3:]:
    __import__(module)
from hypothesis_constants import fixed_constants
from specdec.benchmarks.fuzz import digest, drawn
from specdec.server.document import openapi_document
from specdec.server.schemas import Limits
limits = Limits(model_names=("tiny",), drafters=("none", "ngram"), default_drafter="ngram", vocab_size=64)
with fixed_constants():
    print(digest(drawn(openapi_document(limits, "test"), 200, int(sys.argv[1]))))
"""


def _drawn_in_a_new_process(seed: int, *imported: str) -> str:
    out = subprocess.run([sys.executable, "-c", DRAW, str(seed), str(Path(__file__).parent), *imported],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_seed_draws_the_same_requests_in_every_process():
    """hypothesis also draws constants it finds in the source of the modules a process has loaded: a process that
    has imported more of specdec (a pytest-xdist worker that ran other tests first) drew other requests from the same
    seed. Now it draws the same ones as a bare process; another seed draws others. (The fuzz test above checks that
    what a run sent is what `drawn` draws.)"""
    bare = _drawn_in_a_new_process(1)
    assert _drawn_in_a_new_process(1, "specdec.server.app", "specdec.benchmarks.soak", "specdec.cli.train") == bare
    limits = Limits(model_names=("tiny",), drafters=("none", "ngram"), default_drafter="ngram", vocab_size=64)
    assert digest(drawn(openapi_document(limits, "test"), 200, 2)) != bare  # the digest tells seeds apart


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


def test_a_stopped_run_resumes_from_its_journal_and_sends_only_the_rest(server, tmp_path):
    """A run of thousands of requests stopped at any point (a kill mid-line included) loses nothing: the journal's
    requests are counted, not sent again, and the report is the whole run's; another seed's journal is refused."""
    from specdec.benchmarks.fuzz_journal import FuzzJournal
    from specdec.errors import ConfigError

    path = tmp_path / "fuzz.jsonl"
    journal = FuzzJournal(path)
    whole = fuzz(server.url, "tiny", count=30, seed=3, timeout=60, journal=journal)
    journal.close()
    lines = path.read_bytes().splitlines(keepends=True)
    assert whole.replayed == 0 and len(lines) == 30
    path.write_bytes(b"".join(lines[:12]) + lines[12][:9])  # stopped while writing the 13th line

    journal = FuzzJournal(path)
    resumed = fuzz(server.url, "tiny", count=30, seed=3, timeout=60, journal=journal)
    journal.close()
    assert resumed.replayed == 12 and resumed.requests == 30
    assert resumed.as_dict()["requests_digest"] == whole.as_dict()["requests_digest"]
    assert resumed.by_status == whole.by_status and len(path.read_bytes().splitlines()) == 30

    journal = FuzzJournal(path)
    with pytest.raises(ConfigError, match="other requests"):
        fuzz(server.url, "tiny", count=30, seed=4, timeout=60, journal=journal)
    journal.close()
