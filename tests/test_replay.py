"""Acceptance traces and their what-if replay: a replay of the drafter and draft length that ran reproduces every
logged step exactly; other policies are priced from the trace's verify costs."""
import json

import pytest
import torch

from specdec.cli.main import main
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.engine import SpecDecoder
from specdec.costs import CostModel
from specdec.replay import replay_drafter, replay_logged, replay_plain, replayable
from specdec.trace import read_trace
from tiny import loaded, tiny_llama


def _prompts():
    gen = torch.Generator().manual_seed(7)
    out = []
    for i in range(6):
        p = torch.randint(0, 63, (6 + 2 * i,), generator=gen).tolist()
        out.append(p * 3)  # repeats, so that lookup drafts get accepted
    return out


def _traced(tmp_path, drafter, k: int, adaptive: bool, batched: bool = False):
    target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2), "kernels")
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=k, adaptive=adaptive),
                          costs=CostModel({1: 0.010, 2: 0.011, 4: 0.012, 8: 0.015, 16: 0.02}))
    path = tmp_path / "trace.jsonl"
    decoder.trace_to(path)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    if batched:
        decoder.generate_many(_prompts(), config, max_batch=3)
    else:
        for p in _prompts():
            decoder.generate_ids(p, config)
    decoder.generate(_prompts()[0], max_new_tokens=5, temperature=1.0, seed=1)  # sampled: recorded, not replayed
    return path


@pytest.mark.parametrize("name,make", [("ngram", lambda: NgramDrafter(1, 3)), ("suffix", SuffixDrafter)])
def test_replaying_the_logged_drafter_reproduces_every_step(tmp_path, name, make):
    """Greedy output does not depend on the drafter, so the trace fixes what the drafter would have had accepted:
    the same drafter at the same fixed draft length takes exactly the logged steps (the suffix index learning each
    output in turn, as it did)."""
    path = _traced(tmp_path, make(), k=4, adaptive=False)
    costs, records = read_trace(path)
    requests = replayable(records)
    assert len(records) == 7 and len(requests) == 6 and costs[8] == 0.015
    assert all(r["drafter"] == name and r["k_max"] == 4 and not r["adaptive"] for r in requests)
    logged = replay_logged(requests, CostModel(costs))
    replayed = replay_drafter(requests, make, name, costs, k=4)
    assert replayed.per_request == logged.per_request
    assert logged.accepted > 0 and (replayed.steps, replayed.accepted) == (logged.steps, logged.accepted)
    plain = replay_plain(requests, CostModel(costs))
    assert plain.tokens == replayed.tokens == sum(len(r["output_ids"]) - 1 for r in requests)
    assert plain.steps == plain.tokens and plain.seconds == pytest.approx(plain.tokens * 0.010)
    # priced step by step: verify(1 + drafted) from the trace's curve, plus the drafting time measured here
    want = sum(CostModel(costs).verify_s(1 + d) for steps in replayed.per_request for d, _ in steps)
    assert replayed.seconds == pytest.approx(want + replayed.draft_seconds)


def test_batched_requests_are_traced_too_and_other_lengths_replay(tmp_path):
    path = _traced(tmp_path, NgramDrafter(1, 3), k=3, adaptive=False, batched=True)
    costs, records = read_trace(path)
    requests = replayable(records)
    assert sorted(len(r["prompt_ids"]) for r in requests) == sorted(len(p) for p in _prompts())
    assert all(len(r["output_ids"]) == 40 for r in requests)
    assert replay_drafter(requests, lambda: NgramDrafter(1, 3), "ngram", costs, k=3).per_request == \
        replay_logged(requests, CostModel(costs)).per_request
    one, adaptive = (replay_drafter(requests, lambda: NgramDrafter(1, 3), "ngram", costs, k=k) for k in (1, None))
    assert all(d <= 1 for steps in one.per_request for d, _ in steps)
    assert all(d <= 8 for steps in adaptive.per_request for d, _ in steps) and adaptive.tokens == one.tokens


def test_replay_cli_prints_a_table_and_writes_json(tmp_path, capsys):
    path = _traced(tmp_path, NgramDrafter(1, 3), k=4, adaptive=False)
    out_json = tmp_path / "replay.json"
    assert main(["replay", str(path), "--drafters", "ngram,suffix", "--k", "2,4,adaptive", "--with-steps",
                 "--ngram-min", "1", "--ngram-max", "3", "--out-json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "6 requests replayed of 7" in text and "ngram k=4" in text and "suffix k=adaptive" in text
    data = json.loads(out_json.read_text())
    rows = {p["name"]: p for p in data["policies"]}
    assert rows["ngram k=4"]["steps"] == rows["logged"]["steps"]
    assert rows["ngram k=4"]["mean_accepted_tokens"] > 1 and data["plain"]["mean_accepted_tokens"] == 1
    assert rows["ngram k=4"]["per_request_steps"] == rows["logged"]["per_request_steps"]
    assert rows["logged"]["measured_tokens_per_s"] > 0


@pytest.mark.parametrize("args,message", [
    (["replay", "/nonexistent/trace.jsonl"], "trace file not found"),
    (["replay", "TRACE", "--drafters", "eagle"], "cannot replay eagle without the model"),
    (["replay", "TRACE", "--k", "0"], "--k takes draft lengths"),
    (["replay", "BAD"], "not a specdec trace line"),
])
def test_replay_bad_input_is_one_line(tmp_path, capsys, args, message):
    good = _traced(tmp_path, NgramDrafter(1, 3), k=2, adaptive=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"type": "header", "verify_costs_s": {"1": 0.01}}\n{"type": "request"}\n')
    args = [str(good) if a == "TRACE" else str(bad) if a == "BAD" else a for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def _index_file(path, sequences, vocab_size=64, model=""):
    from specdec.drafters.lookup.suffix import SuffixIndex

    index = SuffixIndex.load(path, vocab_size, model=model)
    index.store_all(sequences)
    index.save()
    return path


def test_a_suffix_index_file_is_where_the_replayed_suffix_drafter_starts(tmp_path, capsys):
    """With an index holding the traced outputs themselves (as a server that served them before would), the suffix
    drafter drafts further than from an empty index; ngram, which reads no index, replays the same. (Fixed draft
    lengths: the adaptive policy also weighs the drafting time measured as it replays.)"""
    path = _traced(tmp_path, NgramDrafter(1, 3), k=4, adaptive=False)
    _, records = read_trace(path)
    outputs = [r["prompt_ids"] + r["output_ids"] for r in replayable(records)]
    index = _index_file(tmp_path / "index.safetensors", outputs)
    rows = {}
    for name, extra in (("empty", []), ("file", ["--suffix-index", str(index)])):
        out_json = tmp_path / f"{name}.json"
        assert main(["replay", str(path), "--k", "2,4", "--ngram-min", "1", "--ngram-max", "3",
                     "--out-json", str(out_json), *extra]) == 0
        rows[name] = {p["name"]: p for p in json.loads(out_json.read_text())["policies"]}
    assert "suffix from" in capsys.readouterr().out
    for k in ("2", "4"):
        with_file, without = rows["file"][f"suffix k={k}"], rows["empty"][f"suffix k={k}"]
        assert with_file["mean_accepted_tokens"] > without["mean_accepted_tokens"]
        assert rows["file"][f"ngram k={k}"]["steps"] == rows["empty"][f"ngram k={k}"]["steps"]
    # fixed k=4 from an index holding every output: each step after the first of a request drafts 4 and keeps them
    assert rows["file"]["suffix k=4"]["acceptance_rate"] > 0.9


@pytest.mark.parametrize("kind,message", [
    ("missing", "suffix index not found"),
    ("not an index", "could not read suffix index"),
    ("other model", "was written for model other-model"),
    ("small vocabulary", "was written for a vocabulary of 8 tokens"),
])
def test_replay_refuses_an_index_that_does_not_fit_the_trace_in_one_line(tmp_path, capsys, kind, message):
    path = _traced(tmp_path, NgramDrafter(1, 3), k=2, adaptive=False)
    index = tmp_path / "index.safetensors"
    if kind == "not an index":
        index.write_text("not safetensors")
    elif kind == "other model":
        _index_file(index, [[1, 2, 3]], model="other-model")
    elif kind == "small vocabulary":
        _index_file(index, [[1, 2, 3]], vocab_size=8)
    assert main(["replay", str(path), "--suffix-index", str(index)]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
