"""Drafting with a random EAGLE-3 head keeps the target's greedy output exactly (trees and chains, three
backends), and building one leaves a target shared with another decoder as it was."""
import pytest
import torch

from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from eagle3_heads import LAYERS, write_eagle3
from tiny import drafted_keeping_greedy_output, loaded


@pytest.mark.parametrize("backend, tree", [("kernels", True), ("kernels", False), ("torch", True), ("hf", False)])
def test_an_eagle3_head_keeps_greedy_output(eagle3_target, tmp_path, backend, tree):
    """A random head drafts poorly, but the output must be exactly the target's (float32), trees and chains."""
    target = loaded(eagle3_target, backend)
    write_eagle3(tmp_path / "head", eagle3_target, draft_vocab=eagle3_target.config.vocab_size // 2)
    drafter = create_drafter("eagle", target, eagle_head=tmp_path / "head", tree=tree)
    assert drafter.feature_layers == LAYERS  # declared, asked of the target with each pass
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
    assert drafted_keeping_greedy_output(decoder, target) > 0


def test_an_eagle3_drafter_leaves_the_shared_target_as_it_was(eagle3_target, tmp_path):
    """Building an EAGLE-3 drafter on a target changes nothing another decoder sharing it sees: the target's
    hidden states keep their width, and an EAGLE-1 decoder on it generates the same tokens, before and after."""
    from specdec.config import GenerationConfig
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head

    target = loaded(eagle3_target, "kernels")
    torch.manual_seed(1)
    other = SpecDecoder(target, EagleDrafter(new_head(target.hf_model, "tiny", torch.arange(64))),
                        SpeculationConfig(num_speculative_tokens=4))
    prompt, config = [1, 5, 9, 13, 2, 7, 30, 4], GenerationConfig(max_new_tokens=12, ignore_eos=True)

    def width() -> int:
        cache = target.backend.new_cache()
        try:
            return target.backend.forward(cache, torch.tensor(prompt), output_hidden=True).hidden.shape[-1]
        finally:
            target.backend.release(cache)

    before, before_width = other.generate_ids(prompt, config)[0], width()
    write_eagle3(tmp_path / "head", eagle3_target, draft_vocab=eagle3_target.config.vocab_size // 2)
    eagle3 = SpecDecoder(target, create_drafter("eagle", target, eagle_head=tmp_path / "head"),
                         SpeculationConfig(num_speculative_tokens=4))
    assert eagle3.generate_ids(prompt, config)[0] == before  # greedy: the target's tokens either way
    assert width() == before_width == eagle3_target.config.hidden_size
    assert other.generate_ids(prompt, config)[0] == before
