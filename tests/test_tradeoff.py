"""The figures that measure what a lossy rule costs (specdec/bench/tradeoff.py), on hand-made outputs."""
import pytest

from specdec.bench.tradeoff import differences, final_number, final_number_agreement, method_name


def test_differences_count_positions_and_the_common_prefix():
    exact = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]
    got = [[1, 2, 3, 4], [5, 9, 7], [7, 0, 9]]  # identical; differs from position 1 and runs longer; one token swapped
    figures = differences(got, exact)
    # positions: 4 + 3 + 3 = 10; mismatched: 0 + 2 + 1; before the first difference: 4 + 1 + 1
    assert figures == {"token_mismatch_share": pytest.approx(3 / 10), "diverged_share": pytest.approx(1 - 6 / 10),
                       "identical": 1, "prompts": 3}
    assert differences(exact, exact)["token_mismatch_share"] == differences(exact, exact)["diverged_share"] == 0


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
