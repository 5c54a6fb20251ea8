"""Extracting training data through the target: teacher-forced labels are the target's own choices on a given
answer, a second turn continues the target's own answer, a killed extraction resumes to the same data, a server's
traces are read by teacher forcing (traces of another model refused), and a folder holding more records than asked
for is read by whole shards."""
import json

import pytest
import torch

from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.training.datamix import DataFile, Item, parse_data_spec, read_items
from specdec.training.shards import ShardWriter, read_shards
from training_records import SENTENCES, extract, write_jsonl


def test_teacher_forcing_labels_are_the_targets_own_choices_on_the_given_answer(tiny_target, tmp_path):
    items = [Item("s", SENTENCES[0], response=SENTENCES[1]), Item("s", SENTENCES[2], response=SENTENCES[3])]
    extract(tiny_target, items, tmp_path)
    seqs = read_shards(tmp_path)
    assert len(seqs) == 2
    for item in items:
        prompt = SpecDecoder(tiny_target, None).encode(item.prompt)
        answer = tiny_target.tokenizer(item.response, add_special_tokens=False)["input_ids"]
        expected = prompt + answer + [tiny_target.info.eos_token_ids[0]]
        (seq,) = [s for s in seqs if s["tokens"].tolist() == expected]  # batches are sorted by length
        # the head learns to predict the answer and its end, not the prompt
        assert seq["trainable"].tolist() == [t >= len(prompt) - 1 for t in range(len(seq["tokens"]) - 1)]
        cache = tiny_target.backend.new_cache()
        logits = tiny_target.backend.forward(cache, seq["tokens"][:-1]).logits
        tiny_target.backend.release(cache)
        assert seq["labels"].tolist() == logits.argmax(-1).tolist()
        assert torch.equal(seq["topk_ids"][:, 0], seq["labels"])
        lp = seq["topk_logprobs"].float()
        assert (lp <= 0).all() and (lp[:, :-1] >= lp[:, 1:] - 1e-3).all()
        torch.testing.assert_close(lp, torch.log_softmax(logits, -1).topk(lp.shape[1]).values, atol=2e-3, rtol=1e-3)


def test_a_follow_up_turn_continues_the_targets_own_answer(tiny_target, tmp_path):
    item = Item("chat", SENTENCES[4], follow_up=SENTENCES[5])  # words the tiny tokenizer knows
    extract(tiny_target, [item], tmp_path)
    first, second = read_shards(tmp_path)
    assert (first["source"], second["source"]) == ("chat", "chat+turn2")
    answer_from = int(first["trainable"].nonzero()[0]) + 1
    answer = [t for t in first["tokens"][answer_from:].tolist() if t not in tiny_target.info.eos_token_ids]
    text = tiny_target.tokenizer.decode(second["tokens"].tolist())
    assert SENTENCES[5] in text and tiny_target.tokenizer.decode(answer, skip_special_tokens=True).strip() in text
    # in the second sequence only the second answer is learnt
    learnt_from = int(second["trainable"].nonzero()[0]) + 1
    assert tiny_target.tokenizer.decode(second["tokens"][:learnt_from].tolist()).rstrip().endswith("<|assistant|>")
    assert SENTENCES[5] in tiny_target.tokenizer.decode(second["tokens"][:learnt_from].tolist())


def test_extraction_killed_between_blocks_resumes_to_the_same_data(tiny_target, tmp_path, monkeypatch):
    items = [Item("s", w) if i % 2 else Item("s", w, response=SENTENCES[-1 - i]) for i, w in enumerate(SENTENCES)]
    extract(tiny_target, items, tmp_path / "whole", block=2)
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
        extract(tiny_target, items, tmp_path / "cut", block=2)
    monkeypatch.setattr(ShardWriter, "flush", original)
    assert json.loads((tmp_path / "cut" / "index.json").read_text())["done"] == 2
    extract(tiny_target, items, tmp_path / "cut", block=2)
    whole, cut = read_shards(tmp_path / "whole"), read_shards(tmp_path / "cut")
    assert len(whole) == len(cut) == len(SENTENCES)
    for a, b in zip(whole, cut):
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["features"], b["features"])


def test_a_servers_traces_are_read_by_teacher_forcing_on_the_targets_own_outputs(tiny_target, tmp_path):
    from specdec.config import GenerationConfig

    traces = tmp_path / "traces"
    traces.mkdir()
    decoder = SpecDecoder(tiny_target, None)
    decoder.trace_to(traces)  # a folder: the writer opens its own file there
    outputs = [decoder.generate_ids(decoder.encode(w), GenerationConfig(max_new_tokens=6, ignore_eos=True))[0]
               for w in SENTENCES[:3]]
    decoder.tracer.close()
    (trace,) = traces.glob("trace-*.jsonl")
    items = read_items(parse_data_spec(str(traces)))
    assert len(items) == 3 and {i.source for i in items} == {f"trace:{tiny_target.name}"}
    expected = {tuple(decoder.encode(w) + out) for w, out in zip(SENTENCES, outputs)}
    assert {i.token_ids for i in items} == expected
    assert all(i.follow_up is None for i in items)  # the answer is there: nothing for the target to write
    extract(tiny_target, items, tmp_path / "data")
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


def test_training_reads_only_the_first_records_asked_for_though_the_folder_holds_more(tiny_target, tmp_path):
    """A data folder extended by a longer run still trains a shorter one on its own first records (whole shards),
    and an index that does not say which records each shard holds is read whole or not at all."""
    from specdec.training.shards import shards_for

    items = [Item("s", w) for w in SENTENCES[:6]]
    extract(tiny_target, items, tmp_path, block=2)
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
