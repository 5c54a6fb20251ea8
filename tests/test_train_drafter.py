"""Training smoke test: self-distilled data from a tiny target, a few training steps, save and reload."""
import json

import pytest
import torch

from specdec.drafters.heads.eagle3_head import default_feature_layers, new_eagle3_head
from specdec.drafters.heads.eagle3_loading import load_eagle3_head
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.heads.eagle_loading import load_head
from specdec.errors import ConfigError, IncompatibleDraftError
from specdec.models.loading import load_model
from specdec.training.batching import TrainSettings, choose_draft_vocab, collate
from specdec.training.eagle_trainer import unrolled_losses, unrolled_mask
from specdec.training.extract import generate_training_data
from specdec.training.shards import read_data, read_shards
from specdec.training.heldout import heldout_agreement, split_heldout
from specdec.training.trainer import Trainer
from tiny import loss_after_training

PROMPTS = ["the cat sat on the mat", "a big red dog ran to the house", "the sun and the moon", "she was in the tree",
           "they ran up and down the hill", "we see the blue sky", "I was on the mat again", "he ran from the dog"]


@pytest.fixture(scope="module")
def data(tmp_path_factory, tiny_folder):
    target = load_model(str(tiny_folder), dtype="float32")
    folder = tmp_path_factory.mktemp("data")
    generate_training_data(target, PROMPTS[:5], folder, max_new_tokens=24, batch_size=3, progress=False)
    first = json.loads((folder / "index.json").read_text())
    stats = generate_training_data(target, PROMPTS, folder, max_new_tokens=24, batch_size=3, progress=False)  # resumes
    return target, folder, first, stats


def test_self_distillation_records_features_and_choices(data):
    target, folder, first, stats = data
    assert first["done"] == 5 and stats["sequences"] == len(PROMPTS)
    seqs = read_shards(folder)
    assert len(seqs) == len(PROMPTS)
    H = target.info.hidden_size
    for s in seqs:
        L = len(s["tokens"])
        assert s["features"].shape == (L - 1, H) and s["labels"].shape == (L - 1,)
    # the answer is the target's own greedy choice: labels after the prompt equal the next tokens
    s = seqs[0]
    prompt_len = len(target.tokenizer.apply_chat_template([{"role": "user", "content": PROMPTS[0]}],
                                                          add_generation_prompt=True, tokenize=True)["input_ids"])
    assert s["labels"][prompt_len - 1:].tolist() == s["tokens"][prompt_len:].tolist()


def test_sampled_answers_at_a_tiny_temperature_are_the_greedy_ones(data):
    """Sampling at a temperature far below float32's range is greedy decoding, not NaN probabilities."""
    from specdec.training.teacher import decode_batch
    target = data[0]
    prompts = [target.tokenizer.encode(p) for p in PROMPTS[:2]]
    eos = (target.tokenizer.eos_token_id,)
    greedy = [out[0] for out in decode_batch(target.backend, prompts, 12, eos, keep_features=False)]
    tiny = [out[0] for out in decode_batch(target.backend, prompts, 12, eos, temperature=5e-324, seeds=[1, 2],
                                           keep_features=False)]
    assert tiny == greedy


def test_unrolled_mask_reproduces_drafting_context():
    m = unrolled_mask(4, 3).view(3, 4, 3, 4)
    # step 1 is causal over true pairs
    assert torch.equal(m[0, :, 0], torch.ones(4, 4, dtype=torch.bool).tril())
    # step 3 at position 3 sees true pairs 0..1, its step-2 parent at 2 and itself at 3
    assert m[2, 3, 0].tolist() == [True, True, False, False]
    assert m[2, 3, 1].tolist() == [False, False, True, False]
    assert m[2, 3, 2].tolist() == [False, False, False, True]


@pytest.fixture(scope="module")
def eagle3_data(tmp_path_factory, tiny_folder):
    """Data holding the inputs of an EAGLE-3 head's layers (the tiny target's 0 and 1)."""
    target = load_model(str(tiny_folder), dtype="float32")
    layers = default_feature_layers(target.info.num_layers)
    folder = tmp_path_factory.mktemp("data3")
    generate_training_data(target, PROMPTS, folder, max_new_tokens=24, batch_size=3, progress=False,
                           feature_layers=layers)
    return target, folder, layers


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
def test_training_lowers_the_loss_and_the_head_reloads(request, kind, tmp_path, other_vocab_folder):
    if kind == "eagle":
        (target, folder, _, _), layers = request.getfixturevalue("data"), ()
    else:
        target, folder, layers = request.getfixturevalue("eagle3_data")
    seqs = read_data([folder], target, layers)
    ids, coverage = choose_draft_vocab(seqs, 32, target.info.vocab_size)
    assert 0 < coverage <= 1
    torch.manual_seed(0)
    head = new_eagle3_head(target.hf_model, "tiny", ids, layers) if layers else new_head(target.hf_model, "tiny", ids)
    load = load_eagle3_head if layers else load_head
    settings = TrainSettings(steps=2, lr=3e-3, warmup=1, batch_tokens=512, holdout=0.2, feature_noise=0.0)
    trainer = Trainer(head, seqs, tmp_path / "head", settings, time_budget_s=1e9)
    batch = collate(trainer.train, 512)

    before, after = loss_after_training(head, unrolled_losses, batch, settings, trainer.vocab_index)
    assert after < 0.7 * before
    stats = trainer.evaluate()
    assert 0 <= stats["acc1"] <= 1 and stats["chain_mat"] >= 1
    assert heldout_agreement(head, split_heldout(seqs, settings)[1], settings) == stats  # what bench scripts call
    trainer.checkpoint(stats)
    loaded = load(tmp_path / "head", target)
    for name, tensor in head.trainable_state().items():
        torch.testing.assert_close(loaded.trainable_state()[name], tensor.to(torch.bfloat16).float())
    other = load_model(str(other_vocab_folder), dtype="float32")
    with pytest.raises(IncompatibleDraftError):
        load(tmp_path / "head", other)


def test_eagle3_data_holds_the_inputs_of_its_layers(data, eagle3_data):
    """EAGLE-3 data stores the inputs of the head's layers beside the final state (one extraction trains either
    kind); data without those layers is refused for an EAGLE-3 head."""
    target, folder, layers = eagle3_data
    seqs = read_data([folder], target, layers)
    final = read_data([folder], target)
    with pytest.raises(ConfigError, match="holds the inputs of layers none"):
        read_data([data[1]], target, layers)
    assert seqs[0]["features"].shape[-1] == len(layers) * target.info.hidden_size
    assert final[0]["features"].shape[-1] == target.info.hidden_size
    assert torch.equal(final[0]["labels"], seqs[0]["labels"])
    cache = target.backend.new_cache()
    hidden = target.backend.forward(cache, seqs[0]["tokens"][:-1], output_hidden=True, feature_layers=layers).hidden
    torch.testing.assert_close(seqs[0]["features"].float(), hidden[:, target.info.hidden_size:],
                               atol=0.05, rtol=0.02)  # stored in bfloat16


def test_sampled_answers_still_record_the_targets_greedy_choices(tiny_folder, tmp_path):
    target = load_model(str(tiny_folder), dtype="float32")
    generate_training_data(target, PROMPTS[:3], tmp_path, max_new_tokens=24, batch_size=3, temperature=1.5,
                           progress=False)
    sampled_off_greedy = 0
    for s in read_shards(tmp_path):
        cache = target.backend.new_cache()
        logits = target.backend.forward(cache, s["tokens"][:-1]).logits  # teacher-forced: (L-1, V)
        target.backend.release(cache)
        assert s["labels"].tolist() == logits.argmax(-1).tolist()
        sampled_off_greedy += int((s["labels"] != s["tokens"][1:]).sum())
    assert sampled_off_greedy > 0  # the answers were sampled, not greedy


def test_synthetic_prompts_open_with_training_words_and_are_cached(tiny_folder, tmp_path, monkeypatch):
    from specdec.training import extract, selfdistill

    target = load_model(str(tiny_folder), dtype="float32")
    openings = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    made = selfdistill.synthesize_prompts(target, openings, tmp_path, temperature=3.0, max_tokens=64, batch_size=8,
                                          progress=False)
    assert made and len(set(made)) == len(made)
    starts = {" ".join(o.split()[:n]) for o in openings for n in range(2, 6)}
    assert all(any(p.startswith(s) for s in starts) and len(p.split()) > 2 for p in made)
    assert len((tmp_path / "synthetic_prompts.jsonl").read_text().splitlines()) == len(openings)

    def no_generation(*args, **kwargs):
        raise AssertionError("the cached prompts should have been reused")

    monkeypatch.setattr(extract, "decode_batch", no_generation)
    assert selfdistill.synthesize_prompts(target, openings, tmp_path, progress=False) == made


def test_synthetic_openings_cycle_over_sources(tmp_path):
    from specdec.training.selfdistill import cycle_sources

    path = tmp_path / "p.jsonl"
    rows = [{"source": "big", "prompt": f"b{i}"} for i in range(5)] + [{"source": "small", "prompt": "s0"}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert cycle_sources(path, 6) == ["b0", "s0", "b1", "s0", "b2", "s0"]


def test_training_data_of_another_target_is_refused(data, other_vocab_folder):
    from specdec.errors import ConfigError
    
    target, folder, _, _ = data
    assert len(read_data([folder, folder], target)) == 2 * len(PROMPTS)
    with pytest.raises(ConfigError, match="holds data from target"):
        read_data([folder], load_model(str(other_vocab_folder), dtype="float32"))


def test_document_tasks_wrap_the_targets_own_answers(tiny_folder):
    """Each task holds one answer the target wrote (the text after its turn opens), under the templates in turn;
    answers too short to summarise are skipped, and texts serve again under the next template."""
    from specdec.errors import ConfigError
    from specdec.training.selfdistill import DOCUMENT_TASKS, document_prompts

    tokenizer = load_model(str(tiny_folder), dtype="float32").tokenizer

    def sequence(prompt: str, answer: str) -> dict:
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return {"tokens": torch.tensor(ids + tokenizer(answer, add_special_tokens=False)["input_ids"])}

    long_a, long_b = "the cat sat on the mat and ran to the big house", "we see the sun and the moon in the sky"
    sequences = [sequence("the cat", long_a), sequence("a dog", "he ran"), sequence("the sky", long_b)]
    tasks = document_prompts(sequences, tokenizer, 5, min_tokens=6)
    assert tasks[0] == DOCUMENT_TASKS[0].format(doc=long_a)
    assert tasks[1] == DOCUMENT_TASKS[1].format(doc=long_b)
    assert tasks[2] == DOCUMENT_TASKS[3].format(doc=long_a)  # second round: the next template
    assert all("he ran" not in t for t in tasks)
    with pytest.raises(ConfigError, match="no answer of"):
        document_prompts(sequences, tokenizer, 2, min_tokens=50)


def test_medusa_training_lowers_the_loss_and_the_heads_reload(data, tmp_path):
    from specdec.drafters.heads.medusa_head import load_medusa_heads, new_medusa_heads
    from specdec.training.medusa_trainer import medusa_losses

    target, folder, _, _ = data
    seqs = read_shards(folder)
    ids, _ = choose_draft_vocab(seqs, 32, target.info.vocab_size)
    torch.manual_seed(0)
    heads = new_medusa_heads(target.hf_model, "tiny", ids, num_heads=3)
    settings = TrainSettings(steps=3, lr=3e-3, warmup=1, batch_tokens=512, holdout=0.2, feature_noise=0.0)
    trainer = Trainer(heads, seqs, tmp_path / "medusa", settings, time_budget_s=1e9, objective=medusa_losses)
    batch = collate(trainer.train, 512)

    before, after = loss_after_training(heads, medusa_losses, batch, settings, trainer.vocab_index, lr=1e-2)
    assert after < 0.7 * before
    stats = trainer.evaluate()
    assert set(stats) == {"acc1", "acc2", "acc3", "chain_mat"} and 1.0 <= stats["chain_mat"] <= 4.0
    trainer.checkpoint(stats)
    back = load_medusa_heads(tmp_path / "medusa", target)
    for name, tensor in heads.trainable_state().items():
        torch.testing.assert_close(back.trainable_state()[name], tensor.to(torch.bfloat16).float())


def test_medusa_heads_learn_only_where_the_tokens_between_are_the_targets():
    """Head d at position t is scored against the target's choice at t + d only where tokens t+1..t+d follow
    the target (prompt text the target would not have written is skipped)."""
    from specdec.drafters.heads.medusa_head import MedusaConfig, MedusaHeads
    from specdec.training.medusa_trainer import medusa_losses

    config = MedusaConfig(target="t", target_fingerprint=None, hidden_size=4, num_heads=2, num_layers=1, vocab_size=6,
                          draft_vocab_size=6)
    heads = MedusaHeads(config, torch.randn(6, 4), torch.arange(6))
    tokens = torch.tensor([[0, 1, 2, 3, 4, 5]])  # positions 0..5
    labels = torch.tensor([[9, 2, 3, 0, 5]]).clamp(max=5)  # the target's choice after each position
    labels[0, 0] = 4  # after token 0 the target would say 4, not the prompt's 1
    features = torch.randn(1, 5, 4)
    settings = TrainSettings(steps=2, feature_noise=0.0)
    from specdec.training.batching import Batch

    batch = Batch(tokens, features, labels, torch.tensor([6]), torch.ones(1, 5, dtype=torch.bool), labels[..., None],
                  torch.zeros(1, 5, 1))
    _, accs = medusa_losses(heads, batch, settings, torch.arange(6), train=False)
    # follows: t=0 no (1 != 4), t=1 yes (2), t=2 yes (3), t=3 no (4 != 0), t=4 yes (5)
    # head 1 at t needs follows[t] and a label at t+1: t in {1, 2}; head 2 needs follows[t, t+1]: t = 1
    assert accs[0][1] == 2
    assert accs[1][1] <= 1
