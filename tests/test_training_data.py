"""Training data mixes and their extraction: weights, teacher forcing, second turns, resuming after a kill, and
training that resumes exactly."""
import json

import pytest
import torch

from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.models.loading import load_model
from specdec.training.batching import Batch, TrainSettings, is_heldout, windows
from specdec.training.datamix import FOLLOW_UPS, DataFile, Item, mix_order, parse_data_spec, read_items
from specdec.training.extract import Extractor, data_meta
from specdec.training.shards import ShardWriter, read_shards
from specdec.training.trainer import split_heldout

WORDS = ["the cat sat on the mat", "a big red dog ran to the house", "the sun and the moon", "she was in the tree",
         "they ran up and down the hill", "we see the blue sky"]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


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


@pytest.fixture(scope="module")
def target(tiny_folder):
    return load_model(str(tiny_folder), dtype="float32")


def extract(target, items, folder, **kwargs):
    writer = ShardWriter(folder, data_meta(target, 12, 0.0))
    return Extractor(target, max_new_tokens=12, batch_size=2, max_len=256).run(items, writer, progress=False,
                                                                                 **kwargs)


def test_teacher_forcing_labels_are_the_targets_own_choices_on_the_given_answer(target, tmp_path):
    items = [Item("s", WORDS[0], response=WORDS[1]), Item("s", WORDS[2], response=WORDS[3])]
    extract(target, items, tmp_path)
    seqs = read_shards(tmp_path)
    assert len(seqs) == 2
    for item in items:
        prompt = SpecDecoder(target, None).encode(item.prompt)
        answer = target.tokenizer(item.response, add_special_tokens=False)["input_ids"]
        expected = prompt + answer + [target.info.eos_token_ids[0]]
        (seq,) = [s for s in seqs if s["tokens"].tolist() == expected]  # batches are sorted by length
        # the head learns to predict the answer and its end, not the prompt
        assert seq["trainable"].tolist() == [t >= len(prompt) - 1 for t in range(len(seq["tokens"]) - 1)]
        cache = target.backend.new_cache()
        logits = target.backend.forward(cache, seq["tokens"][:-1]).logits
        target.backend.release(cache)
        assert seq["labels"].tolist() == logits.argmax(-1).tolist()
        assert torch.equal(seq["topk_ids"][:, 0], seq["labels"])
        lp = seq["topk_logprobs"].float()
        assert (lp <= 0).all() and (lp[:, :-1] >= lp[:, 1:] - 1e-3).all()
        torch.testing.assert_close(lp, torch.log_softmax(logits, -1).topk(lp.shape[1]).values, atol=2e-3, rtol=1e-3)


def test_a_follow_up_turn_continues_the_targets_own_answer(target, tmp_path):
    item = Item("chat", WORDS[4], follow_up=WORDS[5])  # words the tiny tokenizer knows
    extract(target, [item], tmp_path)
    first, second = read_shards(tmp_path)
    assert (first["source"], second["source"]) == ("chat", "chat+turn2")
    answer_from = int(first["trainable"].nonzero()[0]) + 1
    answer = [t for t in first["tokens"][answer_from:].tolist() if t not in target.info.eos_token_ids]
    text = target.tokenizer.decode(second["tokens"].tolist())
    assert WORDS[5] in text and target.tokenizer.decode(answer, skip_special_tokens=True).strip() in text
    # in the second sequence only the second answer is learnt
    learnt_from = int(second["trainable"].nonzero()[0]) + 1
    assert target.tokenizer.decode(second["tokens"][:learnt_from].tolist()).rstrip().endswith("<|assistant|>")
    assert WORDS[5] in target.tokenizer.decode(second["tokens"][:learnt_from].tolist())


def test_extraction_killed_between_blocks_resumes_to_the_same_data(target, tmp_path, monkeypatch):
    items = [Item("s", w) if i % 2 else Item("s", w, response=WORDS[-1 - i]) for i, w in enumerate(WORDS)]
    extract(target, items, tmp_path / "whole", block=2)
    calls = {"n": 0}
    original = ShardWriter.flush

    def dying_flush(self, done):
        calls["n"] += 1
        if calls["n"] == 2:
            (self.folder / "shard_00001.safetensors").write_bytes(b"half a file")  # what a kill can leave
            raise KeyboardInterrupt
        original(self, done)

    monkeypatch.setattr(ShardWriter, "flush", dying_flush)
    with pytest.raises(KeyboardInterrupt):
        extract(target, items, tmp_path / "cut", block=2)
    monkeypatch.setattr(ShardWriter, "flush", original)
    assert json.loads((tmp_path / "cut" / "index.json").read_text())["done"] == 2
    extract(target, items, tmp_path / "cut", block=2)
    whole, cut = read_shards(tmp_path / "whole"), read_shards(tmp_path / "cut")
    assert len(whole) == len(cut) == len(WORDS)
    for a, b in zip(whole, cut):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["features"], b["features"])


def test_long_sequences_split_into_windows_covering_each_position_once():
    L = 23
    seq = {"tokens": torch.arange(L), "labels": torch.arange(1, L), "features": torch.randn(L - 1, 2),
           "trainable": torch.arange(L - 1) >= 5, "source": "x"}
    parts = windows(seq, 8)
    assert all(len(p["tokens"]) <= 8 and len(p["labels"]) == len(p["tokens"]) - 1 for p in parts)
    covered = torch.cat([p["labels"] for p in parts])
    assert covered.tolist() == list(range(1, L))  # every scored position once, in order (none of it was dropped)
    assert windows(seq, 64) == [seq]
    assert is_heldout(seq, 0.5) == is_heldout(dict(seq), 0.5)


def test_the_heldout_split_is_disjoint_and_stays_the_same_as_the_data_grows():
    gen = torch.Generator().manual_seed(0)

    def seq(i):
        L = 6 + i % 5
        return {"tokens": torch.randint(0, 50, (L,), generator=gen), "labels": torch.zeros(L - 1, dtype=torch.long),
                "features": torch.zeros(L - 1, 2), "trainable": torch.ones(L - 1, dtype=torch.bool), "source": "x"}

    seqs = [seq(i) for i in range(80)]
    settings = TrainSettings(holdout=0.2, max_len=64)
    train, held = split_heldout(seqs[:40], settings)
    train_all, held_all = split_heldout(seqs, settings)
    assert held and {id(w) for w in train}.isdisjoint(id(w) for w in held)
    assert len(train) + len(held) == 40
    assert {id(w) for w in held} <= {id(w) for w in held_all}  # more data never moves a held-out sequence
    assert [id(w) for w in held_all] == [id(w) for w in split_heldout(list(seqs), settings)[1]]


def test_soft_labels_reduce_to_top1_for_a_certain_target_and_differ_otherwise():
    from specdec.training.eagle_trainer import _token_loss, target_distribution

    logits = torch.randn(1, 3, 5)
    lab = torch.tensor([[0, 2, 4]])
    mask = torch.ones(1, 3, dtype=torch.bool)
    topk = torch.tensor([[[0, 1], [2, 3], [4, 0]]])
    certain = torch.tensor([[[0.0, -60.0], [0.0, -60.0], [0.0, -60.0]]])
    batch = Batch(torch.zeros(1, 5, dtype=torch.long), torch.zeros(1, 4, 1), torch.zeros(1, 4, dtype=torch.long),
                  torch.tensor([5]), mask, torch.cat([topk[:, :1], topk], 1), torch.cat([certain[:, :1], certain], 1))
    vocab_index = torch.arange(5)
    top1 = _token_loss(logits, lab, None, mask)
    torch.testing.assert_close(_token_loss(logits, lab, target_distribution(batch, 3, vocab_index), mask), top1)
    batch.topk_logprobs[:] = torch.log(torch.tensor([0.6, 0.4]))
    assert abs(float(_token_loss(logits, lab, target_distribution(batch, 3, vocab_index), mask) - top1)) > 1e-4


def test_training_stopped_and_resumed_gives_the_weights_of_an_uninterrupted_run(target, tmp_path):
    from specdec.drafters.eagle_head import new_head
    from specdec.training.batching import choose_draft_vocab
    from specdec.training.trainer import Trainer

    items = [Item("s", w) for w in WORDS] + [Item("t", w, response=" ".join(WORDS)) for w in WORDS]
    extract(target, items, tmp_path / "data")
    seqs = read_shards(tmp_path / "data")
    ids, _ = choose_draft_vocab(seqs, 32, target.info.vocab_size)
    settings = TrainSettings(steps=2, lr=3e-3, warmup=2, batch_tokens=96, holdout=0.2, max_len=48)

    def trainer(out):
        torch.manual_seed(0)
        return Trainer(new_head(target.hf_model, "tiny", ids), seqs, out, settings, time_budget_s=1e9, max_steps=9)

    whole = trainer(tmp_path / "whole")
    whole.run(progress=False)
    first = trainer(tmp_path / "cut")
    first.run(progress=False, stop_after=4)
    first.checkpoint(first.evaluate())
    torch.rand(7)  # whatever the process did in between
    resumed = trainer(tmp_path / "cut")
    resumed.run(progress=False)
    assert resumed.step == whole.step == 9 and resumed.epoch == whole.epoch
    for a, b in zip(whole.params, resumed.params):
        assert torch.equal(a, b)
    drop_time = [{k: v for k, v in h.items() if k != "elapsed_s"} for h in (resumed.history[-1], whole.history[-1])]
    assert drop_time[0] == drop_time[1]
    assert (tmp_path / "cut" / "learning_curve.png").is_file()
    record = json.loads((tmp_path / "cut" / "eagle_config.json").read_text())["training"]
    assert record["tokens_seen"] == whole.tokens_seen > 0
    with pytest.raises(ConfigError, match="repeat-source"):  # an epoch of other sequences is not a resume
        Trainer(new_head(target.hf_model, "tiny", ids), seqs, tmp_path / "cut", settings, time_budget_s=1e9,
                repeats={"s": 2}).resume()
    repeated = Trainer(new_head(target.hf_model, "tiny", ids), seqs, tmp_path / "rep", settings, time_budget_s=1e9,
                       repeats={"t": 3})
    assert len(repeated.heldout) == len(whole.heldout)  # held-out sequences count once
    count = {name: sum(w["source"] == name for w in repeated.train) for name in "st"}
    once = {name: sum(w["source"] == name for w in whole.train) for name in "st"}
    assert count == {"s": once["s"], "t": 3 * once["t"]} and once["t"] > 0


def test_a_servers_traces_are_read_by_teacher_forcing_on_the_targets_own_outputs(target, tmp_path):
    from specdec.config import GenerationConfig

    traces = tmp_path / "traces"
    traces.mkdir()
    decoder = SpecDecoder(target, None)
    decoder.trace_to(traces)  # a folder: the writer opens its own file there
    outputs = [decoder.generate_ids(decoder.encode(w), GenerationConfig(max_new_tokens=6, ignore_eos=True))[0]
               for w in WORDS[:3]]
    decoder.tracer.close()
    (trace,) = traces.glob("trace-*.jsonl")
    items = read_items(parse_data_spec(str(traces)))
    assert len(items) == 3 and {i.source for i in items} == {f"trace:{target.name}"}
    expected = {tuple(decoder.encode(w) + out) for w, out in zip(WORDS, outputs)}
    assert {i.token_ids for i in items} == expected
    assert all(i.follow_up is None for i in items)  # the answer is there: nothing for the target to write
    extract(target, items, tmp_path / "data")
    for seq, item in zip(sorted(read_shards(tmp_path / "data"), key=lambda s: s["tokens"].tolist()),
                         sorted(items, key=lambda i: list(i.token_ids))):
        assert seq["tokens"].tolist() == list(item.token_ids)
        assert seq["trainable"].tolist() == [t >= item.answer_from - 1 for t in range(len(item.token_ids) - 1)]
        # greedy outputs: the target's own choices are the traced tokens
        assert seq["labels"][item.answer_from - 1:].tolist() == list(item.token_ids[item.answer_from:])
    broken = tmp_path / "broken.jsonl"
    broken.write_text(trace.read_text().split("\n", 1)[1])  # request records without their header
    with pytest.raises(ConfigError, match="broken.jsonl:1: not a training record"):
        read_items(DataFile(broken))


def test_traces_of_another_model_are_refused(tiny_folder, tmp_path, capsys):
    from specdec.cli.main import main

    trace = write_jsonl(tmp_path / "t.jsonl", [{"type": "header", "model": "some-other-model"},
                                               {"type": "request", "prompt_ids": [1, 2], "output_ids": [3]}])
    code = main(["train-drafter", "--model", str(tiny_folder), "--data", str(trace), "--out", str(tmp_path / "h"),
                 "--dtype", "float32", "--data-only"])
    assert code == 2 and "traces of some-other-model" in capsys.readouterr().err


def test_a_fine_tuned_heads_vocabulary_is_the_datas_then_its_own():
    from specdec.training.batching import choose_draft_vocab

    seqs = [{"labels": torch.tensor([7, 7, 3, 9]), "trainable": torch.tensor([True, True, True, False])}]
    ids, coverage = choose_draft_vocab(seqs, 4, 20, prior=torch.tensor([1, 2, 3, 15, 16]))
    assert 7 in ids and 3 in ids and coverage == 1.0  # every token the data counts comes first
    assert set(ids.tolist()) - {7, 3} <= {1, 2, 15, 16}  # the rest from the head's own vocabulary, not arbitrary
    assert ids.tolist() == sorted(ids.tolist())


def test_training_reads_only_the_first_records_asked_for_though_the_folder_holds_more(target, tmp_path):
    """A data folder extended by a longer run still trains a shorter one on its own first records (whole shards),
    and an index that does not say which records each shard holds is read whole or not at all."""
    from specdec.training.shards import shards_for

    items = [Item("s", w) for w in WORDS[:6]]
    extract(target, items, tmp_path, block=2)
    every = read_shards(tmp_path)
    assert len(every) == 6
    index = json.loads((tmp_path / "index.json").read_text())
    assert [len(read_shards(tmp_path, max_items=n)) for n in (0, 1, 2, 3, 6, 99)] == [0, 2, 2, 4, 6, 6]
    assert shards_for(index, 3)[1] == 4 and shards_for(index, None)[1] == 6
    first = read_shards(tmp_path, max_items=4)
    assert all(torch.equal(a["tokens"], b["tokens"]) for a, b in zip(first, every[:4]))
    for shard in index["shards"]:
        del shard["items_done"]
    assert len(shards_for(index, None)[0]) == 3
    with pytest.raises(ConfigError, match="which records"):
        shards_for(index, 3)


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
