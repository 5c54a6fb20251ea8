"""Which EAGLE-3 heads are loaded and which refused: heads outside the authors' layout, heads for another target,
pickled heads, EAGLE-1 heads asked for as EAGLE-3, misspelt drafter options; and specdec's own heads saved in the
authors' layout and read back."""
import json

import pytest
import torch

from specdec.drafters import create_drafter
from specdec.drafters.heads.eagle3_head import new_eagle3_head
from specdec.drafters.heads.eagle3_loading import load_eagle3_head
from specdec.errors import ConfigError, IncompatibleDraftError, ModelLoadError
from eagle3_heads import LAYERS, write_eagle3
from tiny import loaded, tiny_llama


@pytest.mark.parametrize("change, error, message", [
    ({"fc.weight": torch.zeros(64, 128).half()}, IncompatibleDraftError, "does not fit"),  # fc over 2 layers, not 3
    ({"norm.weight": None}, ModelLoadError, "missing tensors norm.weight"),
    ({"medusa_head.0.weight": torch.zeros(4, 4).half()}, ModelLoadError, "unexpected tensors medusa_head"),
    ({"d2t": None}, ModelLoadError, "no d2t"),
    ({"d2t": torch.full((40,), 1000)}, ModelLoadError, "does not map"),
    ({"embed_tokens.weight": torch.zeros(10, 64).half()}, IncompatibleDraftError, "embedding of shape"),
])
def test_a_head_outside_the_layout_is_refused(eagle3_target, tmp_path, change, error, message):
    target = loaded(eagle3_target, "torch")
    write_eagle3(tmp_path / "head", eagle3_target, **change)
    with pytest.raises(error, match=message):
        load_eagle3_head(tmp_path / "head", target)


def test_heads_for_other_targets_are_refused(eagle3_target, tmp_path):
    target = loaded(eagle3_target, "torch")
    write_eagle3(tmp_path / "layer", eagle3_target, layers=(2, 4, 8))
    with pytest.raises(IncompatibleDraftError, match="reads target layer 8"):
        load_eagle3_head(tmp_path / "layer", target)
    write_eagle3(tmp_path / "wide", tiny_llama(seed=0, hidden=32, heads=4, kv_heads=2, layers=8))
    with pytest.raises(IncompatibleDraftError, match="hidden size 32"):
        load_eagle3_head(tmp_path / "wide", target)
    other = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2, layers=8)  # the same sizes, other weights
    new_eagle3_head(other, "other", torch.arange(32), LAYERS).save(tmp_path / "mine")
    with pytest.raises(IncompatibleDraftError, match="trained for target 'other'"):
        load_eagle3_head(tmp_path / "mine", target)


def test_a_pickled_head_is_refused(eagle3_target, tmp_path):
    target = loaded(eagle3_target, "torch")
    write_eagle3(tmp_path / "head", eagle3_target)
    (tmp_path / "head" / "model.safetensors").rename(tmp_path / "head" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        create_drafter("eagle", target, eagle_head=tmp_path / "head")


def test_specdec_heads_save_in_the_authors_layout_and_reload(eagle3_target, tmp_path):
    target = loaded(eagle3_target, "torch")
    ids = torch.tensor([1, 4, 9, 16, 25, 36, 49, 63])
    torch.manual_seed(0)
    head = new_eagle3_head(eagle3_target, "tiny", ids, LAYERS)
    head.save(tmp_path / "head", dtype=torch.float32, extra={"note": "test"})
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)  # vLLM's convention: the inputs read
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in LAYERS]  # SGLang's
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert torch.equal(tensors["d2t"] + torch.arange(8), ids) and int(tensors["t2d"].sum()) == 8
    assert tensors["fc.weight"].shape == (64, 192) and "midlayer.self_attn.q_proj.weight" in tensors
    back = load_eagle3_head(tmp_path / "head", target)
    assert torch.equal(back.draft_ids, ids)
    for name, tensor in head.trainable_state().items():
        torch.testing.assert_close(back.trainable_state()[name], tensor)


def test_drafter_eagle3_needs_an_eagle3_head(eagle3_target, tmp_path):
    from specdec.drafters.heads.eagle_head import new_head

    target = loaded(eagle3_target, "torch")
    with pytest.raises(ConfigError, match="no EAGLE-3 head is known for 'tiny'.*--kind eagle3"):
        create_drafter("eagle3", target)
    new_head(eagle3_target, "tiny", torch.arange(64)).save(tmp_path / "eagle1")
    with pytest.raises(ConfigError, match="holds no EAGLE-3 head"):
        create_drafter("eagle3", target, eagle_head=tmp_path / "eagle1")
    drafter = create_drafter("eagle", target, eagle_head=tmp_path / "eagle1")
    assert drafter.columns == slice(0, 64)  # the final state


def test_drafters_are_named_as_asked_and_unknown_options_are_refused(eagle3_target, tmp_path):
    """The eagle3 drafter is called "eagle3" (its costs, metrics and select's candidates are kept apart from
    eagle's); an option that no drafter takes is an error naming it, never silently dropped."""
    target = loaded(eagle3_target, "torch")
    write_eagle3(tmp_path / "head", eagle3_target)
    assert create_drafter("eagle3", target, eagle_head=tmp_path / "head").name == "eagle3"
    assert create_drafter("eagle3", target, eagle_head=tmp_path / "head").fork().name == "eagle3"
    assert create_drafter("eagle", target, eagle_head=tmp_path / "head").name == "eagle"
    chosen = create_drafter("select", target, eagle_head=tmp_path / "head", select_from="eagle,eagle3,ngram")
    assert list(chosen.candidates) == ["eagle", "eagle3", "ngram"]  # once refused as the same candidate twice
    with pytest.raises(ConfigError, match="unknown drafter option eagle_haed; the drafters take: .*eagle_head"):
        create_drafter("eagle3", target, eagle_haed=tmp_path / "head")
    with pytest.raises(ConfigError, match="unknown drafter options max_m, mn_n"):
        create_drafter("ngram", target, mn_n=1, max_m=3)
    # an option of another drafter is one of the shared set: the n-gram drafter does not take it
    assert create_drafter("ngram", target, eagle_head=tmp_path / "head").name == "ngram"
