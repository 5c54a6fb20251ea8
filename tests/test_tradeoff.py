"""The figures that measure what a lossy rule costs (specdec/benchmarks/tradeoff.py), on hand-made outputs."""
import pytest

from specdec.benchmarks.tradeoff import differences, final_number, final_number_agreement, method_name, off_greedy_share


def test_differences_count_positions_and_the_common_prefix():
    exact = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    got = [[1, 2, 3, 4], [5, 9, 7], [7, 0, 9]]  # identical; differs from position 1 and runs longer; one token swapped
    figures = differences(got, exact)
    # positions: 4 + 3 + 3 = 10; mismatched: 0 + 2 + 1; before the first difference: 4 + 1 + 1
    assert figures == {"token_mismatch_share": pytest.approx(3 / 10), "diverged_share": pytest.approx(1 - 6 / 10),
                       "identical": 1, "prompts": 3}
    assert differences(exact, exact)["token_mismatch_share"] == differences(exact, exact)["diverged_share"] == 0


def test_off_greedy_share_counts_tokens_that_are_not_the_targets_choice():
    assert off_greedy_share([[1, 2, 3], [4]], [[1, 9, 3], [5]]) == 2 / 4
    with pytest.raises(ValueError):  # a choice per output token
        off_greedy_share([[1, 2]], [[1]])


def test_differences_refuse_unpaired_outputs():
    with pytest.raises(ValueError):
        differences([[1]], [[1], [2]])


@pytest.mark.parametrize("text,number", [("She sold 48 + 24 = 72 clips.", "72"), ("It costs $1,200.50 in all", "1200.5"),
                                         ("The answer is 18.00.", "18"), ("a loss of -3", "-3"),
                                         ("no number here", None), ("5 apples, then 0.25", "0.25")])
def test_final_number_is_the_last_number_written_canonically(text, number):
    assert final_number(text) == number


def test_final_number_agreement_judges_only_questions_exact_answered_with_a_number():
    exact = ["so 72", "it is 10", "I cannot say"]
    got = ["so 72.0", "it is 12", "maybe 3"]
    assert final_number_agreement(got, exact) == {"agree": 1, "questions": 2, "share": 0.5}
    assert final_number_agreement(["x"], ["y"])["share"] is None


def test_method_names_mark_the_lossy_rule():
    assert method_name("specdec", "eagle", "exact") == "specdec:eagle"
    assert method_name("specdec", "eagle", "top-k:4") == "specdec:eagle[top-k:4]"


def test_the_tradeoff_script_runs_every_rule_against_exact_decoding(tmp_path, tiny_folder):
    """bench/lossy_tradeoff.py on a tiny model: each rule is a labelled method; exact speculation equals plain
    decoding; the plot is written (matplotlib is the bench extra's)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "lossy_tradeoff.py"
    questions = tmp_path / "q.jsonl"
    questions.write_text("\n".join(json.dumps({"source": s, "prompt": t}) for s, t in [
        ("self-instruct", "the sky"), ("gsm8k-train", "the cat sat on the mat the cat"),
        ("gsm8k-train", "a red dog ran to a red dog"), ("gsm8k-train", "the sun and the moon")]))
    out, plot = tmp_path / "t.json", tmp_path / "t.png"
    proc = subprocess.run([sys.executable, str(script), "--gsm8k", str(questions), "--gsm8k-count", "2", "--model",
                           str(tiny_folder), "--max-new-tokens", "10", "-k", "3", "--drafters", "ngram",
                           "--acceptance", "top-k:8,threshold:0.05,typical:0.5", "--out-json", str(out),
                           "--plot", str(plot)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    methods = result["methods"]
    assert list(methods) == ["specdec:none", "specdec:ngram", "specdec:ngram[top-k:8]",
                             "specdec:ngram[threshold:0.05]", "specdec:ngram[typical:0.5]"]
    assert result["prompt_sets"] == {"gsm8k": 2}
    exact = methods["specdec:ngram"]
    assert exact["lossy"] is False and exact["token_mismatch_share"] == 0 and exact["identical"] == 2
    assert exact["speed_over_exact"] == 1.0
    assert exact["off_greedy_share"] == methods["specdec:none"]["off_greedy_share"] == 0  # the target's own choices
    for name in list(methods)[2:]:
        m = methods[name]
        assert m["lossy"] is True and m["mode"] in name and m["parameter"] is not None
        assert 0 <= m["token_mismatch_share"] <= m["diverged_share"] <= 1
        # an output that differs from exact decoding's departs from the greedy choice where they part
        assert (m["off_greedy_share"] > 0) == (m["identical"] < m["prompts"])
        assert m["by_set"]["gsm8k"]["prompts"] == 2
    assert plot.stat().st_size > 1000
