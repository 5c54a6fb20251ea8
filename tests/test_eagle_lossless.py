"""EAGLE drafting keeps the target's greedy output exactly: chains and dynamic trees on three backends with the
head's products in torch or the CPU kernels, fixed-size trees, trees cut to the room left in the context, and
lookup-only drafts mixed with the head's trees."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.engine import SpecDecoder
from tiny import drafted_keeping_greedy_output, kernel_head, loaded, tiny_llama


@pytest.mark.parametrize("backend", ["kernels", "torch", "hf"])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("head_products", ["torch", "kernels"])
def test_eagle_drafting_keeps_greedy_output(eagle_target, backend, tree, head_products):
    """An untrained head drafts poorly, but the output must still be exactly the target's."""
    target = loaded(eagle_target, backend)
    torch.manual_seed(1)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
    drafter = EagleDrafter(head if head_products == "torch" else kernel_head(head), tree=tree, width=3)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
    assert drafted_keeping_greedy_output(decoder, target) > 0


@pytest.mark.parametrize("nodes", [1, 5, 12])
def test_fixed_size_trees_hold_their_nodes_and_keep_greedy_output(eagle_target, nodes):
    """A fixed-size tree holds exactly its nodes (within width x depth candidates) even where the measured costs
    would draft none, and the output is still exactly the target's."""
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest
    from specdec.verify import tree_depths

    target = loaded(eagle_target, "kernels")
    torch.manual_seed(3)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
    drafter = EagleDrafter(head, tree=True, width=3, max_nodes=nodes, fixed_size=True, lookup=False)
    prompt = list(range(5, 17))
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    steep = CostModel({1: 0.010, 2: 0.020, 8: 0.080})  # under which a cost-sized tree is empty
    drafter.begin(DraftRequest(prompt_ids=prompt, costs=steep))
    drafter.observe(out.hidden[:-1])
    draft = drafter.propose(prompt, Budget(4, tree=True))
    depths = tree_depths(draft.parents)
    assert len(draft.tokens) == nodes and max(depths) <= 4
    assert all(depths.count(d) <= 3 for d in set(depths))  # at most `width` nodes per level
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False), costs=steep)
    assert drafted_keeping_greedy_output(decoder, target) > 0


def test_trees_larger_than_the_room_left_are_cut_to_fit_the_context():
    """Near the end of the context a fixed 40-node tree is cut to the cache's room; the output is still greedy's."""
    from specdec.config import GenerationConfig

    model = tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2, max_positions=64)
    target = loaded(model, "kernels")
    torch.manual_seed(5)
    head = new_head(model, "tiny", torch.arange(model.config.vocab_size))
    drafter = EagleDrafter(head, tree=True, width=5, max_nodes=40, fixed_size=True, lookup=False)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=8, adaptive=False))
    prompt = list(range(3, 40))
    config = GenerationConfig(max_new_tokens=18, ignore_eos=True)
    plain, _ = SpecDecoder(target, None).generate_ids(prompt, config)
    out, metrics = decoder.generate_ids(prompt, config)
    assert out == plain and len(out) == 18
    assert metrics.drafted_tokens > 0


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_lookup_only_drafts_keep_greedy_output(eagle_target, backend, monkeypatch):
    from specdec.drafters.heads import eagle

    target = loaded(eagle_target, backend)
    torch.manual_seed(1)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
    drafter = EagleDrafter(head, tree=True, width=2)
    kinds = []
    tree = eagle.host_tree

    def spy(*args):
        draft = tree(*args)
        kinds.append(draft.parents is None)
        return draft

    monkeypatch.setattr(eagle, "host_tree", spy)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9, 10] * 5
    assert decoder.generate_ids(prompt, config)[0] == SpecDecoder(target, None).generate_ids(prompt, config)[0]
    assert any(kinds) and not all(kinds)  # both lookup-only chains and head trees were verified
