"""What the trainer trains on and how it resumes: long sequences split into windows covering each position once, a
held-out split that is disjoint and stays put as the data grows, soft labels, a fine-tuned head's draft vocabulary,
and training stopped and resumed giving the weights of an uninterrupted run."""
import json

import pytest
import torch

from specdec.errors import ConfigError
from specdec.training.batching import Batch, TrainSettings, is_heldout, windows
from specdec.training.datamix import Item
from specdec.training.shards import read_shards
from specdec.training.trainer import split_heldout
from training_records import SENTENCES, extract


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


def test_a_fine_tuned_heads_vocabulary_is_the_datas_then_its_own():
    from specdec.training.batching import choose_draft_vocab

    seqs = [{"labels": torch.tensor([7, 7, 3, 9]), "trainable": torch.tensor([True, True, True, False])}]
    ids, coverage = choose_draft_vocab(seqs, 4, 20, prior=torch.tensor([1, 2, 3, 15, 16]))
    assert 7 in ids and 3 in ids and coverage == 1.0  # every token the data counts comes first
    assert set(ids.tolist()) - {7, 3} <= {1, 2, 15, 16}  # the rest from the head's own vocabulary, not arbitrary
    assert ids.tolist() == sorted(ids.tolist())


def test_training_stopped_and_resumed_gives_the_weights_of_an_uninterrupted_run(tiny_target, tmp_path):
    from specdec.drafters.heads.eagle_head import new_head
    from specdec.training.batching import choose_draft_vocab
    from specdec.training.trainer import Trainer

    items = [Item("s", w) for w in SENTENCES] + [Item("t", w, response=" ".join(SENTENCES)) for w in SENTENCES]
    extract(tiny_target, items, tmp_path / "data")
    seqs = read_shards(tmp_path / "data")
    ids, _ = choose_draft_vocab(seqs, 32, tiny_target.info.vocab_size)
    settings = TrainSettings(steps=2, lr=3e-3, warmup=2, batch_tokens=96, holdout=0.2, max_len=48)

    def trainer(out):
        torch.manual_seed(0)
        return Trainer(new_head(tiny_target.hf_model, "tiny", ids), seqs, out, settings, time_budget_s=1e9, max_steps=9)

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
        Trainer(new_head(tiny_target.hf_model, "tiny", ids), seqs, tmp_path / "cut", settings, time_budget_s=1e9,
                repeats={"s": 2}).resume()
    repeated = Trainer(new_head(tiny_target.hf_model, "tiny", ids), seqs, tmp_path / "rep", settings, time_budget_s=1e9,
                       repeats={"t": 3})
    assert len(repeated.heldout) == len(whole.heldout)  # held-out sequences count once
    count = {name: sum(w["source"] == name for w in repeated.train) for name in "st"}
    once = {name: sum(w["source"] == name for w in whole.train) for name in "st"}
    assert count == {"s": once["s"], "t": 3 * once["t"]} and once["t"] > 0
