"""Training data files and their mix: a file's weight after the last colon, a bad record named by its line, any
prefix of the mix keeping the weights with sources taking turns and second turns added, and source families
repeated or excluded by name (a misspelt family refused)."""
import pytest

from specdec.errors import ConfigError
from specdec.training.datamix import FOLLOW_UPS, DataFile, mix_order, parse_data_spec, read_items
from training_records import write_jsonl


def test_data_specs_take_a_weight_after_the_last_colon(tmp_path):
    f = write_jsonl(tmp_path / "a.jsonl", [{"prompt": "x"}])
    assert parse_data_spec(str(f)) == DataFile(f, 1.0)
    assert parse_data_spec(f"{f}:2.5") == DataFile(f, 2.5)
    odd = write_jsonl(tmp_path / "b:c.jsonl", [{"prompt": "x"}])  # a colon inside the name, no weight
    assert parse_data_spec(str(odd)) == DataFile(odd, 1.0)
    for bad, message in ((f"{f}:0", "positive"), (f"{f}:-1", "positive"), (str(tmp_path / "no.jsonl"), "not found")):
        with pytest.raises(ConfigError, match=message):
            parse_data_spec(bad)


def test_a_bad_record_is_named_by_its_line_and_unicode_line_breaks_are_text(tmp_path):
    good = write_jsonl(tmp_path / "g.jsonl", [{"prompt": "one\u2028two"}, {"prompt": "three", "response": "four"}])
    items = read_items(DataFile(good), follow_up_every=0)
    assert {i.prompt for i in items} == {"one\u2028two", "three"}
    for row in ({"response": "no prompt"}, {"prompt": ""}, {"prompt": "x", "response": 3}):
        bad = write_jsonl(tmp_path / "b.jsonl", [{"prompt": "fine"}, row])
        with pytest.raises(ConfigError, match=r"b.jsonl:2: not a training record"):
            read_items(DataFile(bad))


def test_any_prefix_of_the_mix_keeps_the_weights_and_sources_take_turns(tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [{"source": f"s{i % 2}:t", "prompt": f"a{i}", "response": "r"}
                                           for i in range(30)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"source": "q", "prompt": f"b{i}"} for i in range(4)])
    order = mix_order([DataFile(a, 3.0), DataFile(b, 1.0)], follow_up_every=2)
    assert len(order) == 34
    first = order[:8]
    assert sum(i.prompt.startswith("a") for i in first) == 6
    assert [i.source for i in order if i.prompt.startswith("a")][:4] == ["s0:t", "s1:t", "s0:t", "s1:t"]
    # b runs out after 4; a goes on alone
    assert all(i.prompt.startswith("a") for i in order[16:])
    # every second prompt-only record gets a follow-up turn; teacher-forced records never do
    assert [i.follow_up is not None for i in order if i.response is None] == [False, True, False, True]
    assert all(i.follow_up in FOLLOW_UPS for i in order if i.follow_up)
    assert mix_order([DataFile(a, 3.0), DataFile(b, 1.0)], follow_up_every=2, limit=5) == order[:5]


def test_a_repeated_source_family_counts_n_times_with_its_second_turns_and_bad_specs_are_refused():
    from specdec.training.datamix import parse_repeats, repeat_families

    seqs = [{"source": s} for s in ("gsm8k-train:1", "gsm8k-train+turn2", "gsm8k-train-x:2", "t0:xsum")]
    out = repeat_families(seqs, parse_repeats(["gsm8k-train:3", "t0:1"]))
    assert [s["source"] for s in out].count("gsm8k-train:1") == 3 and len(out) == 3 + 3 + 1 + 1
    assert repeat_families(seqs, {}) == seqs
    with pytest.raises(ConfigError, match="gsm8k: no such source family"):
        repeat_families(seqs, {"gsm8k": 2})
    for bad in ("gsm8k-train", "gsm8k-train:0", "gsm8k-train:1.5", ":2"):
        with pytest.raises(ConfigError, match="FAMILY:N"):
            parse_repeats([bad])
    with pytest.raises(ConfigError, match="already repeated 3 times"):
        parse_repeats(["gsm8k-train:3", "gsm8k-train:2"])


def test_excluding_a_source_family_drops_it_and_its_second_turns_and_a_misspelt_one_is_refused():
    from specdec.training.datamix import without_families

    seqs = [{"source": s} for s in ("alpaca_eval-answer:1", "alpaca_eval-answer:2+turn2", "alpaca_eval-oasst:3",
                                    "t0:xsum", "t0+turn2", "gsm8k-train:4")]
    kept = without_families(seqs, ["alpaca_eval-answer", "t0"])
    assert [s["source"] for s in kept] == ["alpaca_eval-oasst:3", "gsm8k-train:4"]  # not a prefix match
    assert without_families(seqs, []) == seqs
    with pytest.raises(ConfigError, match="alpaca-eval-answer: no such source family"):
        without_families(seqs, ["alpaca-eval-answer"])
