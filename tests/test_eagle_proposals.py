"""What the EAGLE drafter proposes for a given state: a width-1 tree is the chain's draft, a tree holds the
prompt-lookup continuation as a root-to-leaf path, the head reads the prompt during prefill, and the head is
skipped where the lookup alone is expected to do better."""
import torch

from specdec.drafters.base import Budget
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from tiny import loaded


def test_eagle_self_consistent_head_is_fully_accepted(eagle_target):
    """A 'head' that copies the target (its layer output replaced by the true next feature is impossible
    to train here), so instead: the tree's best branch equals the chain's draft for the same state."""
    target = loaded(eagle_target, "kernels")
    torch.manual_seed(2)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
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


def test_tree_drafts_hold_the_prompt_lookup_continuation(eagle_target):
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest

    target = loaded(eagle_target, "kernels")
    torch.manual_seed(2)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
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


def test_the_head_reads_the_prompt_during_prefill(eagle_target):
    """The head's pass over the prompt belongs to prefill: it runs when the prompt's features arrive, so the
    first proposal (timed as drafting) feeds the head one pair only."""
    from specdec.drafters.base import DraftRequest

    target = loaded(eagle_target, "kernels")
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
    prompt = list(range(3, 23))
    out = target.backend.forward(target.backend.new_cache(), torch.tensor(prompt), output_hidden=True)
    drafter = EagleDrafter(head, tree=False)
    drafter.begin(DraftRequest(prompt_ids=prompt))
    drafter.observe(out.hidden)  # the prefill's features, one per prompt token
    assert drafter.cache.length == len(prompt) - 1  # every pair (f_t, x_t+1) the prompt holds
    drafter.propose(prompt + [7], Budget(2, tree=True))
    assert drafter.cache.length == len(prompt)


def test_the_head_is_skipped_where_the_lookup_is_trusted(eagle_target):
    from specdec.costs import CostModel
    from specdec.drafters.base import DraftRequest

    target = loaded(eagle_target, "kernels")
    torch.manual_seed(2)
    head = new_head(eagle_target, "tiny", torch.arange(eagle_target.config.vocab_size))
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
