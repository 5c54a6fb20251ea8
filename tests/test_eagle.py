"""EAGLE drafting (chains and dynamic trees) and tree verification."""
import pytest
import torch

from specdec.config import GenerationConfig, SpeculationConfig
from specdec.drafters.base import Budget
from specdec.drafters.eagle import EagleDrafter
from specdec.drafters.eagle_head import new_head
from specdec.drafters.trees import choose_nodes
from specdec.engine import SpecDecoder
from specdec.verify import tree_depths, tree_greedy_verify, tree_mask
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama


def test_tree_mask_and_depths():
    parents = [-1, -1, 0, 2, 1]  # a, b under the root; c under a; d under c; e under b
    m = tree_mask(parents)
    assert m.tolist() == [[1, 0, 0, 0, 0, 0],
                          [1, 1, 0, 0, 0, 0],
                          [1, 0, 1, 0, 0, 0],
                          [1, 1, 0, 1, 0, 0],
                          [1, 1, 0, 1, 1, 0],
                          [1, 0, 1, 0, 0, 1]]
    assert tree_depths(parents) == [1, 1, 2, 3, 2]


def test_tree_greedy_verify_walks_the_matching_branch():
    tokens = torch.tensor([5, 7, 8, 9, 3])
    parents = [-1, -1, 1, 2, 1]  # 5 and 7 under the root; 8 and 3 under 7; 9 under 8
    logits = torch.zeros(6, 10)
    for row, best in enumerate([7, 0, 8, 9, 4, 0]):  # root -> 7, node 1 -> 8, node 2 -> 9, node 3 -> 4
        logits[row, best] = 1.0
    assert tree_greedy_verify(tokens, parents, logits) == ([1, 2, 3], 4)


def test_tree_width_follows_the_cost_curve():
    from specdec.costs import CostModel
    from specdec.drafters.trees import tree_width

    assert tree_width(CostModel({1: 0.010, 64: 0.0105})) == 8  # flat (memory-bound) verify: wide trees
    assert tree_width(CostModel({1: 0.010, 2: 0.011, 4: 0.013, 8: 0.025})) == 2  # compute-bound: narrow


def test_node_choice_follows_the_cost_curve():
    from specdec.costs import CostModel

    scores = [-0.1, -0.2, -0.3, -2.0, -0.4, -5.0]
    parents = [-1, 0, 1, -1, 2, 3]
    flat = CostModel({1: 0.010, 8: 0.0101, 16: 0.0102})
    steep = CostModel({1: 0.010, 2: 0.020, 8: 0.080})
    assert len(choose_nodes(scores, parents, flat, 48)) == 6
    assert choose_nodes(scores, parents, steep, 48) == []
    chosen = choose_nodes(scores, parents, CostModel({1: 0.010, 4: 0.012, 8: 0.030}), 48)
    assert all(parents[i] < 0 or parents[i] in chosen for i in chosen)  # closed under ancestors


def test_fixed_size_node_choice_ignores_the_costs():
    from specdec.costs import CostModel

    scores = [-0.1, -0.2, -0.3, -2.0, -0.4, -5.0]
    parents = [-1, 0, 1, -1, 2, 3]
    steep = CostModel({1: 0.010, 2: 0.020, 8: 0.080})
    assert choose_nodes(scores, parents, steep, 4, fixed_size=True) == [0, 1, 2, 4]  # the 4 most probable
    assert choose_nodes(scores, parents, steep, 48, fixed_size=True) == list(range(6))


def test_tree_shape_options_are_checked():
    from specdec.drafters.options import TreeOptions
    from specdec.errors import ConfigError

    assert TreeOptions().shape() == {}
    assert TreeOptions(tree_width=3, tree_nodes=10).shape() == {"width": 3, "max_nodes": 10, "fixed_size": True}
    for bad in ({"tree_width": 0}, {"tree_nodes": -1}, {"tree_nodes": 2.5}, {"tree_width": True}):
        with pytest.raises(ConfigError, match="must be an integer >= 1"):
            TreeOptions(**bad)


@pytest.fixture(scope="module")
def models():
    target = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    return target


def kernel_head(head):
    from specdec.drafters.eagle_kernels import KernelEagleHead, kernel_head_problem

    problem = kernel_head_problem(head.config)
    if problem:
        pytest.skip(f"the CPU kernels cannot run here: {problem}")
    return KernelEagleHead(head)


@pytest.mark.parametrize("backend", ["kernels", "torch", "hf"])
@pytest.mark.parametrize("tree", [False, True])
@pytest.mark.parametrize("head_products", ["torch", "kernels"])
def test_eagle_drafting_keeps_greedy_output(models, backend, tree, head_products):
    """An untrained head drafts poorly, but the output must still be exactly the target's."""
    target = loaded(models, backend)
    torch.manual_seed(1)
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    drafter = EagleDrafter(head if head_products == "torch" else kernel_head(head), tree=tree, width=3)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
    assert drafted_keeping_greedy_output(decoder, target) > 0


@pytest.mark.parametrize("nodes", [1, 5, 12])
def test_fixed_size_trees_hold_their_nodes_and_keep_greedy_output(models, nodes):
    """A fixed-size tree holds exactly its nodes (within width x depth candidates) even where the measured costs
    would draft none, and the output is still exactly the target's."""
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest
    from specdec.verify import tree_depths

    target = loaded(models, "kernels")
    torch.manual_seed(3)
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
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


def test_eagle_self_consistent_head_is_fully_accepted(models):
    """A 'head' that copies the target (its layer output replaced by the true next feature is impossible
    to train here), so instead: the tree's best branch equals the chain's draft for the same state."""
    target = loaded(models, "kernels")
    torch.manual_seed(2)
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    chain, tree = EagleDrafter(head, tree=False), EagleDrafter(head, tree=True, width=1, max_depth=4)
    from specdec.drafters.base import DraftRequest
    from specdec.costs import CostModel

    prompt = list(range(5, 17))
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    flat = CostModel({1: 0.01, 64: 0.0101})
    for d in (chain, tree):
        d.begin(DraftRequest(prompt_ids=prompt, costs=flat))
        d.observe(out.hidden[:-1])
    context = prompt[:-1] + [prompt[-1]]
    a = chain.propose(context, Budget(4, tree=True))
    b = tree.propose(context, Budget(4, tree=True))
    assert b.parents == [-1, 0, 1, 2]  # width 1 is a chain
    assert a.tokens.tolist() == b.tokens.tolist()


def test_lookup_path_joins_the_tree_through_matching_nodes():
    from specdec.drafters.trees import add_path

    tokens, parents, depths, scores = [5, 6, 7], [-1, -1, 0], [1, 1, 2], [-0.1, -0.5, -0.3]
    chosen = add_path([0, 1, 2], [5, 7, 9, 9], tokens, parents, depths, scores)
    # 5 and 5->7 are reused; 9 and 9 are new nodes under 7, at depths 3 and 4, ranked last
    assert chosen == [0, 1, 2, 3, 4]
    assert tokens[3:] == [9, 9] and parents[3:] == [2, 3] and depths[3:] == [3, 4]
    assert scores[3] == float("-inf")
    # a path through an unchosen node does not reuse it: siblings among the chosen stay distinct
    tokens, parents, depths, scores = [5, 6], [-1, -1], [1, 1], [-0.1, -0.5]
    assert add_path([0], [6], tokens, parents, depths, scores) == [0, 2]
    assert tokens[2] == 6 and parents[2] == -1


def test_tree_drafts_hold_the_prompt_lookup_continuation(models):
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest

    target = loaded(models, "kernels")
    torch.manual_seed(2)
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5]  # ... 3 4 5 occurred before, followed by 6 7 8
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    drafts = {}
    for lookup in (False, True):
        d = EagleDrafter(head, tree=True, width=2, max_depth=4, lookup=lookup)
        d.begin(DraftRequest(prompt_ids=prompt, costs=CostModel({1: 0.01, 64: 0.0101})))
        d.observe(out.hidden[:-1])
        drafts[lookup] = d.propose(prompt, Budget(4, tree=True))
    tree = drafts[True]
    node, path = -1, []
    for want in (6, 7, 8, 9):  # the lookup continuation is a root-to-leaf path
        node = next(i for i, (t, p) in enumerate(zip(tree.tokens.tolist(), tree.parents)) if p == node and t == want)
        path.append(node)
    assert len(path) == 4
    assert len(tree) >= len(drafts[False])


def test_a_bfloat16_head_keeps_float32_rope_frequencies(models):
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    exact = head.inv_freq.clone()
    head = head.to(torch.bfloat16)
    assert head.fc.weight.dtype == torch.bfloat16 and head.embed.dtype == torch.bfloat16
    assert head.inv_freq.dtype == torch.float32 and torch.equal(head.inv_freq, exact)


def test_the_kernel_head_computes_what_the_torch_head_does(models):
    """Prompt pairs, a tree level under a mask, then accepted pairs after the prompt (causal), through both: the
    same hidden states, keys and logits (float32)."""
    torch.manual_seed(4)
    head = new_head(models, "tiny", torch.arange(40))
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    fast = kernel_head(head)
    H = models.config.hidden_size
    feats, tokens, positions = torch.randn(1, 9, H), torch.randint(0, 64, (1, 9)), torch.arange(9)[None]
    level = torch.randn(1, 3, H), torch.tensor([[4, 5, 6]]), torch.full((1, 3), 9)
    mask = torch.ones(1, 1, 3, 12, dtype=torch.bool)
    mask[0, 0, :, 9:] = torch.eye(3, dtype=torch.bool)  # siblings see the prompt and themselves
    with torch.no_grad():
        want, want_kv = head(feats, tokens, positions)
        got, got_kv = fast(feats, tokens, positions)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got_kv, want_kv, atol=1e-5, rtol=1e-5)
        want2, _ = head(*level, past=want_kv, mask=mask)
        got2, _ = fast(*level, past=got_kv, mask=mask)
        torch.testing.assert_close(got2, want2, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(fast.draft_logits(got2), head.draft_logits(want2), atol=1e-5, rtol=1e-5)
        more = torch.randn(1, 2, H), torch.tensor([[7, 8]]), torch.tensor([[9, 10]])  # accepted pairs: causal
        want3, want3_kv = head(*more, past=want_kv)
        got3, got3_kv = fast(*more, past=got_kv)
        torch.testing.assert_close(got3, want3, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got3_kv, want3_kv, atol=1e-5, rtol=1e-5)


def test_heads_the_kernels_cannot_run_are_named_with_the_reason():
    """A head whose head dim the kernels' attention cannot read 16 lanes at a time drafts in torch instead."""
    from specdec.drafters.eagle_kernels import kernel_head_problem

    target = tiny_llama(seed=0, hidden=64, heads=8, kv_heads=2)  # head dim 8
    config = new_head(target, "tiny", torch.arange(target.config.vocab_size)).config
    assert kernel_head_problem(config) == "head dim 8 not a multiple of 16"


def test_the_head_reads_the_prompt_during_prefill(models):
    """The head's pass over the prompt belongs to prefill: it runs when the prompt's features arrive, so the
    first proposal (timed as drafting) feeds the head one pair only."""
    from specdec.drafters.base import DraftRequest

    target = loaded(models, "kernels")
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    prompt = list(range(3, 23))
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    drafter = EagleDrafter(head, tree=False)
    drafter.begin(DraftRequest(prompt_ids=prompt))
    drafter.observe(out.hidden)  # the prefill's features, one per prompt token
    assert drafter.kv[0].shape[2] == len(prompt) - 1  # every pair (f_t, x_t+1) the prompt holds
    drafter.propose(prompt + [7], Budget(2, tree=True))
    assert drafter.kv[0].shape[2] == len(prompt)


def test_lookup_record_scores_what_was_accepted():
    from specdec.costs import CostModel
    from specdec.drafters.trees import LookupRecord

    record = LookupRecord()
    assert record.rate() == 0.5  # no evidence yet
    record.proposed([1] * 10, [6, 7, 8])
    record.score([1] * 10 + [6, 7, 9, 4])  # two accepted, the third rejected
    assert (record.accepted, record.trials) == (2, 3)
    record.proposed([1] * 14, [5, 5])
    record.score([1] * 14 + [5, 5, 2])  # both accepted (then the bonus token)
    assert (record.accepted, record.trials) == (4, 5)
    record.score([1] * 20)  # nothing pending: nothing changes
    assert record.rate() == 5 / 7
    assert record.expected([0, 0]) == pytest.approx(5 / 7 + (5 / 7) ** 2)
    chain = [0] * 8
    assert record.best_length(chain, CostModel({1: 0.01, 64: 0.0101})) == 8  # flat verify cost: all of it
    assert record.best_length(chain, CostModel({1: 0.01, 2: 0.02, 8: 0.08})) == 1  # steep: the first token


def test_the_head_is_skipped_where_the_lookup_is_trusted(models):
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest

    target = loaded(models, "kernels")
    torch.manual_seed(2)
    head = new_head(models, "tiny", torch.arange(models.config.vocab_size))
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 11, 3, 4, 5]  # lookup continuation: 6 7 8 9
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    drafter = EagleDrafter(head, tree=True, width=2, max_depth=4)
    drafter.begin(DraftRequest(prompt_ids=prompt, costs=CostModel({1: 0.01, 64: 0.0101})))
    drafter.observe(out.hidden[:-1])
    tree = Budget(4, tree=True)
    assert drafter.propose(prompt, tree).parents is not None  # no estimate of the head's trees yet: a tree
    assert drafter.branch.head_expected is not None
    drafter.branch.head_expected = 0.1  # the continuation's prior expectation (0.5 + 0.25 + ...) beats it
    lookup_only = drafter.propose(prompt, tree)
    assert lookup_only.parents is None and lookup_only.tokens.tolist() == [6, 7, 8, 9]
    drafter.branch.head_expected = 5.0
    assert drafter.propose(prompt, tree).parents is not None


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_lookup_only_drafts_keep_greedy_output(models, backend):
    target = loaded(models, backend)
    torch.manual_seed(1)
    drafter = EagleDrafter(new_head(models, "tiny", torch.arange(models.config.vocab_size)), tree=True, width=2)
    kinds = []
    tree = drafter._tree

    def spy(*args):
        draft = tree(*args)
        kinds.append(draft.parents is None)
        return draft

    drafter._tree = spy
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9, 10] * 5
    assert decoder.generate_ids(prompt, config)[0] == SpecDecoder(target, None).generate_ids(prompt, config)[0]
    assert any(kinds) and not all(kinds)  # both lookup-only chains and head trees were verified
