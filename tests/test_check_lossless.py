"""`specdec check-lossless` (specdec/lossless.py): its statistics agree with scipy's, it passes a correct engine and
catches broken verification (sampling and greedy), and its command line works end to end on a model folder."""
import json
from collections import Counter

import pytest
from scipy import stats

from specdec.config import SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.engine import SpecDecoder
from specdec.lossless import LosslessReport, check_greedy, check_sampling, chi2_survival, homogeneity
from test_cli import run_cli
from test_sampling_lossless import _accept_all
from tiny import TableLM, loaded, table_target, tiny_llama

VOCAB, PROMPT = 5, [1, 3, 1, 3, 2]
SPECULATION = SpeculationConfig(num_speculative_tokens=3, sampling_verifier="rejection")  # its samples have seeds


def table_decoder() -> SpecDecoder:
    """A toy target and an unrelated draft table (drafts are often rejected, so resampling matters)."""
    return SpecDecoder(table_target(VOCAB, seed=0), DraftModelDrafter(TableLM(VOCAB, seed=11, scale=2.5), VOCAB),
                       SPECULATION)


def test_chi2_survival_matches_scipy():
    for statistic, dof in [(0.5, 1), (3.84, 1), (12.0, 5), (40.0, 20), (150.0, 100)]:
        assert chi2_survival(statistic, dof) == pytest.approx(stats.chi2.sf(statistic, dof), rel=1e-9)


def test_homogeneity_matches_scipy_contingency():
    a = Counter({"x": 40, "y": 35, "z": 25})
    b = Counter({"x": 30, "y": 45, "z": 25})
    got = homogeneity("t", a, b)
    want = stats.chi2_contingency([[40, 35, 25], [30, 45, 25]], correction=False)
    assert got.statistic == pytest.approx(want.statistic) and got.dof == want.dof
    assert got.p_value == pytest.approx(want.pvalue)


def test_homogeneity_pools_rare_outcomes_and_handles_no_variation():
    a = Counter({"x": 90, "r1": 2, "r2": 1, "y": 7})
    b = Counter({"x": 85, "r3": 3, "y": 12})
    got = homogeneity("t", a, b)
    want = stats.chi2_contingency([[90, 7, 3], [85, 12, 3]], correction=False)  # r1, r2, r3 pooled
    assert got.dof == 2 and got.p_value == pytest.approx(want.pvalue)
    assert homogeneity("t", Counter({"x": 50}), Counter({"x": 50})).p_value == 1.0


@pytest.mark.parametrize("batch", [1, 5])
def test_correct_engine_passes_the_sampling_check(batch):
    """Alone, and five requests at a time in the batched engine (drafts allocated jointly, verified per sequence)."""
    sampling = SamplingConfig(temperature=1.0, top_p=0.9, repetition_penalty=1.3)
    check = check_sampling(table_decoder(), PROMPT, sampling, samples=2000, tokens=4, speculation=SPECULATION,
                           batch=batch)
    report = LosslessReport(sampling=[check])
    assert check.drafted > 2 * 2000 and 0 < check.accepted < check.drafted  # both draft positions, accepted
    # and rejected
    assert not report.failures() and not report.unexercised()


@pytest.mark.parametrize("batch", [1, 5])
def test_broken_acceptance_fails_the_sampling_check(monkeypatch, batch):
    from specdec import verify

    monkeypatch.setattr(verify, "rejection_verify", _accept_all)
    check = check_sampling(table_decoder(), PROMPT, SamplingConfig(temperature=1.0), samples=3000, tokens=3,
                           speculation=SPECULATION, batch=batch)
    report = LosslessReport(sampling=[check])
    failed = report.failures()
    assert failed and all("position 1" not in line for line in failed)  # the first token never sees a draft


def test_greedy_check_identical_then_caught_when_broken(monkeypatch):
    from specdec import verify
    from specdec.drafters.lookup.ngram import NgramDrafter

    target = loaded(tiny_llama(seed=0), backend="torch")
    draft = loaded(tiny_llama(seed=1), backend="torch").backend
    decoder = SpecDecoder(target, DraftModelDrafter(draft, target.info.vocab_size), SPECULATION)
    prompt = [5, 9, 11, 5, 9, 11, 5, 9]
    good = check_greedy(decoder, prompt, 24, SPECULATION)
    assert good.identical and good.drafted > 0

    monkeypatch.setattr(verify, "greedy_verify", lambda draft, logits: (len(draft), int(logits[-1].argmax())))
    bad = check_greedy(SpecDecoder(target, NgramDrafter(1, 3), SPECULATION), prompt, 24, SPECULATION)
    assert not bad.identical and bad.margin is not None and bad.margin > 0
    assert LosslessReport(greedy=[bad]).failures()
    assert not LosslessReport(greedy=[bad], tie_margin=bad.margin).failures()  # within the margin: a near-tie


def test_cli_runs_end_to_end_and_writes_json(capsys, tmp_path, tiny_folder):
    out = tmp_path / "check.json"
    rc, stdout, _ = run_cli(capsys, "check-lossless", "--model", str(tiny_folder), "--no-chat", "--prompt",
                            "the cat sat on the mat the cat", "--drafter", "ngram", "--greedy-tokens", "12",
                            "--samples", "60", "--batch", "4", "--setting", "temperature=1.0,top_k=8",
                            "--out-json", str(out))
    assert rc == 0, stdout
    assert "passed" in stdout.splitlines()[-1]
    report = json.loads(out.read_text())
    assert report["passed"] and report["drafter"] == "ngram" and len(report["greedy"]) == 1
    names = [t["name"] for t in report["sampling"][0]["tests"]]
    assert names == ["joint"] + [f"position {i}" for i in range(1, 5)]  # k = 2 drafts, k + 2 tokens
    assert report["sampling"][0]["batch"] == 4


@pytest.mark.parametrize("argv,message", [
    (["--setting", "temperature=0"], "temperature must be > 0"),
    (["--setting", "warmth=2"], "NAME=VALUE pairs"),
    (["--setting", "top_k=many"], "must be a number"),
    (["--setting", "top_p=1.5"], "top_p"),
    (["--samples", "-1"], "--samples must be >= 0"),
    (["--batch", "0"], "--batch must be >= 1"),
    (["--alpha", "1"], "--alpha must be in (0, 1)"),
    (["--drafter", "none"], "no speculation to check"),
    (["--out-json", "/nonexistent/folder/report.json"], "its folder does not exist"),
])
def test_cli_bad_input_is_one_line(capsys, tiny_folder, argv, message):
    rc, _, err = run_cli(capsys, "check-lossless", "--model", str(tiny_folder), "--no-chat", *argv)
    assert rc == 2 and message in err and len(err.strip().splitlines()) == 1
