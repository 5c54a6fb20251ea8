"""Fuzzing the command line: flags and values hypothesis draws (valid, out of range, wrong types, unknown flags),
and prompt files with a bad line. Every run ends with exit 0, or exit 2 and one line of error; never a traceback."""
import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from specdec.cli.main import main  # noqa: E402

VALUES = st.one_of(st.integers(-3, 40).map(str), st.sampled_from(["0.5", "-1", "1e9", "nan", "", "x", "ngram", "none",
                                                                  "float32", "auto", "[", "{}", "99999=1"]),
                   st.text(max_size=8))
FLAGS = ["--max-new-tokens", "--temperature", "--top-p", "--top-k", "--min-p", "--seed", "--drafter", "-k",
         "--repetition-penalty", "--logprobs", "--stop", "--tree-width", "--tree-nodes", "--draft-p-min",
         "--regex", "--logit-bias", "--backend", "--dtype", "--no-such-flag"]
SWITCHES = ["--no-adaptive", "--stats", "--no-chat", "--chain"]


def run(capsys, argv):
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse
        rc = exc.code
    _, err = capsys.readouterr()
    return rc, err


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(pairs=st.lists(st.tuples(st.sampled_from(FLAGS), VALUES), max_size=4),
       switches=st.lists(st.sampled_from(SWITCHES), max_size=2, unique=True))
def test_generate_with_fuzzed_flags_exits_cleanly(capsys, tiny_folder, pairs, switches):
    argv = ["generate", "the cat", "--model", str(tiny_folder), "--dtype", "float32", "--max-new-tokens", "4"]
    for flag, value in pairs:
        argv += [flag, value]
    rc, err = run(capsys, argv + switches)
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith("[specdec]")]
    assert rc in (0, 2), (argv, err)
    if rc == 2:
        assert len(lines) == 1 and "Traceback" not in err, (argv, err)


@settings(max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(bad=st.one_of(st.text(min_size=1, max_size=20).filter(lambda t: t.strip() and "\n" not in t),
                     st.sampled_from(['{"turns": []}', '{"turns": [""]}', '{"turns": 5}', "[1, 2]", '{"q": 1}'])),
       at=st.integers(0, 3))
def test_a_bad_prompt_file_line_is_named_by_its_number(capsys, tmp_path_factory, bad, at):
    good = json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]})
    lines = [good] * 4
    lines.insert(at, bad)
    try:
        json.loads(bad)["turns"][0].strip()
        return  # a valid line after all
    except Exception:
        pass
    path = tmp_path_factory.mktemp("p") / "prompts.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc, err = run(capsys, ["bench", "--prompts", str(path), "--model", "/nonexistent-model"])
    assert rc == 2 and f"{path}:{at + 1}:" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("bad", ["\r0", "0\r", "\u2028[1]"])
def test_a_carriage_return_inside_a_line_neither_splits_it_nor_shifts_the_numbers(capsys, tmp_path, bad):
    """Found by the fuzzing above: text mode turned a lone "\\r" into a line break, so the error named the next line."""
    good = json.dumps({"question_id": 1, "category": "c", "turns": ["hi"]})
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(("\r\n".join([good, bad, good]) + "\r\n").encode("utf-8"))  # Windows line ends as well
    rc, err = run(capsys, ["bench", "--prompts", str(path), "--model", "/nonexistent-model"])
    assert rc == 2 and f"{path}:2:" in err and len(err.strip().splitlines()) == 1, err
