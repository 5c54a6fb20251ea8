"""EAGLE heads in their authors' layout (no norm before attention, fc's bias zero and untrained), the layout vLLM's and
SGLang's EAGLE-1 layers run: folding a trained head's norm into its attention, and `train-drafter --authors-layout`,
whose heads export for both engines."""
import json

import pytest
import torch

from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.heads.eagle_layout import fc_input_rms, to_authors_layout
from specdec.drafters.heads.eagle_loading import load_head
from specdec.cli.main import main
from training_records import write_jsonl

SENTENCES = ["the cat sat on the mat", "a big red dog ran to the house", "the sun and the moon", "she was in the tree",
             "they ran up and down the hill", "we see the blue sky", "I was on the mat again", "he ran from the dog"]


def trained_looking_head(target, seed: int = 3):
    """A head with an input norm whose every weight (norm gains and fc bias included) is moved by noise."""
    torch.manual_seed(seed)
    head = new_head(target.hf_model, target.name, torch.arange(target.info.vocab_size), input_norm=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.15)
    return head.eval()


def one_position(head, target, seed: int):
    """A feature (1, 1, H) and a token (1, 1) of the target's, the position (1, 1), and fc's output there (H,)."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(1, 1, target.info.hidden_size, generator=gen)
    tokens = torch.randint(0, target.info.vocab_size, (1, 1), generator=gen)
    with torch.no_grad():
        x = head.fc(torch.cat([head.embed[tokens], features], dim=-1))[0, 0]
    return features, tokens, torch.zeros(1, 1, dtype=torch.long), x


def test_the_fold_keeps_the_output_where_the_input_rms_is_the_one_folded_in(tiny_target):
    """Over one position, a head without its fc bias computes the same after the fold at that position's rms (the
    norm's eps included), and not at another rms: the fold scales q, k and v by the norm's gains exactly."""
    head = trained_looking_head(tiny_target)
    with torch.no_grad():
        head.fc.bias.zero_()
    eps = head.config.rms_norm_eps
    for seed in range(3):
        features, tokens, positions, x = one_position(head, tiny_target, seed)
        rms = float((x.pow(2).mean() + eps).sqrt())
        with torch.no_grad():
            want = head(features, tokens, positions)[0]
            folded = to_authors_layout(trained_looking_head(tiny_target), rms)
            assert torch.allclose(folded(features, tokens, positions)[0], want, atol=1e-5)
            away = to_authors_layout(trained_looking_head(tiny_target), rms * 1.5)
            assert not torch.allclose(away(features, tokens, positions)[0], want, atol=1e-3)
        assert (folded.config.input_norm, folded.config.fc_bias) == (False, False)
        assert not folded.fc.bias.requires_grad and bool(folded.fc.bias.eq(0).all())


def test_the_measured_rms_is_the_median_over_positions(tiny_target):
    head = trained_looking_head(tiny_target)
    H, gen = tiny_target.info.hidden_size, torch.Generator().manual_seed(0)
    sequences = [{"tokens": torch.randint(0, tiny_target.info.vocab_size, (n + 1,), generator=gen),
                  "features": torch.randn(n, H, generator=gen) * (1 + i)} for i, n in enumerate((5, 9, 4))]
    with torch.no_grad():
        rms = [head.fc(torch.cat([head.embed[s["tokens"][1:]], s["features"]], -1)).pow(2).mean(-1).sqrt()
               for s in sequences]
    assert fc_input_rms(head, sequences) == pytest.approx(float(torch.cat(rms).median()))
    assert fc_input_rms(head, sequences, positions=5) == pytest.approx(float(rms[0].median()))
    with pytest.raises(ValueError):
        fc_input_rms(head, [])


def train(tiny_folder, tmp_path, out, *options):
    data = write_jsonl(tmp_path / "records.jsonl", [{"prompt": s, "response": " ".join(reversed(s.split()))}
                                                    for s in SENTENCES])
    return main(["train-drafter", "--model", str(tiny_folder), "--data", str(data), "--data-dir",
                 str(tmp_path / "data"), "--out", str(out), "--dtype", "float32", "--time-budget", "0.03",
                 "--batch-size", "4", "--draft-vocab", "16", *options])


def test_a_head_trained_in_the_authors_layout_from_one_with_a_norm_exports_for_both_engines(
        tiny_folder, tiny_target, tmp_path, capsys):
    start = trained_looking_head(tiny_target)
    start.save(tmp_path / "start", dtype=torch.float32)
    assert train(tiny_folder, tmp_path, tmp_path / "head", "--init-from", str(tmp_path / "start"),
                 "--authors-layout") == 0
    assert "input norm folded into its attention" in capsys.readouterr().err
    head = load_head(tmp_path / "head", tiny_target)
    assert (head.config.input_norm, head.config.fc_bias) == (False, False)
    assert bool(head.fc.bias.eq(0).all())  # trained, yet still zero
    folded = to_authors_layout(trained_looking_head(tiny_target), 1.0)
    assert not torch.equal(head.up_proj.weight, folded.up_proj.weight)  # trained on from the start
    saved = json.loads((tmp_path / "head" / "eagle_config.json").read_text())
    assert saved["input_norm"] is False and saved["fc_bias"] is False
    for engine in ("vllm", "sglang"):
        code = main(["export-head", "--model", str(tiny_folder), "--drafter", "eagle", "--engine", engine,
                     "--head", str(tmp_path / "head"), "--out", str(tmp_path / engine)])
        assert code == 0, capsys.readouterr().err
    # the same command on a head with a norm, without --authors-layout, keeps the norm and exports for neither
    assert train(tiny_folder, tmp_path, tmp_path / "normed", "--init-from", str(tmp_path / "start")) == 0
    assert load_head(tmp_path / "normed", tiny_target).config.input_norm
    capsys.readouterr()
    assert main(["export-head", "--model", str(tiny_folder), "--drafter", "eagle", "--engine", "sglang",
                 "--head", str(tmp_path / "normed"), "--out", str(tmp_path / "no")]) == 2
    assert "--authors-layout" in capsys.readouterr().err
    # nor does resuming it in the other layout
    assert train(tiny_folder, tmp_path, tmp_path / "normed", "--authors-layout") == 2
    assert "holds a head in specdec's own layout" in capsys.readouterr().err


def test_the_option_is_refused_where_it_means_nothing(tiny_folder, tmp_path, capsys):
    assert train(tiny_folder, tmp_path, tmp_path / "h3", "--kind", "eagle3", "--authors-layout") == 2
    err = capsys.readouterr().err
    assert "--authors-layout is for --kind eagle" in err and len(err.strip().splitlines()) == 1
