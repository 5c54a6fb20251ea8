"""EAGLE drafting on the device (drafters/eagle_device.py, head_graphs.py), run uncaptured on the CPU: greedy chains
are the host path's, trees are well formed and scored by their paths' draft log-probabilities, and speculation
with it gives plain decoding's tokens. tests/test_cuda_graphs.py checks the captured graphs against this code on a GPU."""
import pytest
import torch

from specdec.config import SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.base import Budget, DraftRequest
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle3_head import new_eagle3_head
from specdec.drafters.heads.eagle_device import HeadCache
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.heads.head_graphs import FEED_BUCKETS, HeadGraphs
from specdec.engine import SpecDecoder
from specdec.verify import tree_depths
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama

LAYERS = (2, 4, 5)  # the EAGLE-3 head's feature layers, of the target's 8


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2, layers=8)


def _noisy(head, seed: int):
    """A fresh head's weights with noise, so that its drafts vary along a chain."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return head.eval()


def _head(model, kind: str):
    """(head, target) of this kind: EAGLE over the full vocabulary, or EAGLE-3 over half of it (the odd tokens,
    so that draft indices and token ids differ)."""
    target = loaded(model, "torch", graphs="on")
    torch.manual_seed(1)
    if kind == "eagle":
        return _noisy(new_head(model, "tiny", torch.arange(64)), 2), target
    head = _noisy(new_eagle3_head(model, "tiny", torch.arange(1, 64, 2), feature_layers=LAYERS), 2)
    return head, target


def _drafter(head, target, device: bool, rows: int | None = None, **options) -> EagleDrafter:
    """rows: the device path's head cache starts with room for that many rows (it grows as drafting needs)."""
    drafter = EagleDrafter(head, lookup=False, device_drafting=device, **options)
    if device and rows:
        drafter.cache = HeadCache(head.config, drafter.device, head.feature_dtype, capacity=rows)
        drafter.graphs = HeadGraphs(head, drafter.cache, capture=False)
    return drafter


def _features(target, tokens: list[int], layers: tuple[int, ...] = ()) -> torch.Tensor:
    """The target's output_hidden rows (n, H + A*H) of every position of tokens: the final state, then the inputs
    of the A feature `layers`."""
    return target.backend.forward(target.backend.new_cache(), torch.tensor(tokens), output_hidden=True,
                                  feature_layers=layers).hidden


def _contexts(n: int = 40):
    """A growing context, step by step (the prompt, then a few tokens at a time), and one step that goes back
    and changes its last tokens (the cache rolls back)."""
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randint(0, 63, (n,), generator=gen).tolist()
    cuts = [12, 13, 17, 18, 24, 31, 40]
    steps = [tokens[:c] for c in cuts]
    steps.insert(4, tokens[:15] + [(t + 1) % 63 for t in tokens[15:18]])  # differs from position 15 on
    return steps


def _run(drafter, target, contexts, budget_of, request: DraftRequest):
    """Drafts at each context in turn, the drafter having observed the features of all but its last position."""
    drafter.begin(request)
    drafts = []
    for context in contexts:
        hidden = _features(target, context, drafter.feature_layers)
        drafter.features.rows = 0  # the features of this context, as if observed step by step
        drafter.observe(hidden[:-1])
        drafts.append(drafter.propose(context, budget_of(context)))
    return drafts


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_device_chains_are_the_host_paths_chains(model, kind, k):
    head, target = _head(model, kind)
    contexts = _contexts()
    drafters = [_drafter(head, target, device, rows=8, tree=False) for device in (False, True)]
    drafts = [_run(drafter, target, contexts, lambda c: Budget(k), DraftRequest(prompt_ids=contexts[0]))
              for drafter in drafters]  # the device path's cache grows from 8 rows to 64
    host, device = ([d.tokens.tolist() for d in run] for run in drafts)
    assert device == host
    again = _run(drafters[1], target, contexts, lambda c: Budget(k), DraftRequest(prompt_ids=contexts[0]))
    assert [d.tokens.tolist() for d in again] == host  # a second request over the same (grown) cache
    assert len({tuple(t) for t in host}) > 1 and all(len(t) == k for t in host)
    assert len(set(sum(host, []))) > 1  # the chains vary: a draft that ignored its inputs would not match


def test_sampled_chains_of_the_device_drafter_take_the_host_path_over_its_cache(model):
    head, target = _head(model, "eagle")
    contexts = _contexts()
    sampling = SamplingConfig(temperature=0.8)
    runs = []
    for device in (False, True):
        request = DraftRequest(prompt_ids=contexts[0], sampling=sampling, generator=torch.Generator().manual_seed(9))
        runs.append(_run(_drafter(head, target, device, tree=False), target, contexts, lambda c: Budget(5), request))
    for host, device in zip(*runs):
        assert device.tokens.tolist() == host.tokens.tolist()
        torch.testing.assert_close(device.probs, host.probs)


def _path_log_probs(drafter, context: list[int], path: list[int]) -> float:
    """The head's draft log-probability of the token path after context, by feeding the path as a chain over the
    true pairs' keys (causal attention, no tree mask): the definition a tree node's score must meet."""
    head, h = drafter.head, drafter._sync(context)
    past, position, total = drafter.cache.past(), len(drafter.pair_tokens), 0.0
    index = {int(t): i for i, t in enumerate(head.draft_ids)}
    for i, token in enumerate(path):
        total += float(torch.log_softmax(head.draft_logits(h).float(), -1)[index[token]])
        out, kv = head(h[None, None], torch.tensor([[token]]), torch.tensor([[position + i]]), past=past)
        past, h = (torch.cat([past[0], kv[0]], 2), torch.cat([past[1], kv[1]], 2)), out[0, 0]
    return total


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("depth, width, nodes", [(1, 3, 2), (3, 2, 6), (4, 3, 7), (5, 4, 48)])
@torch.inference_mode()
def test_device_trees_are_well_formed_and_scored_by_their_paths(model, kind, depth, width, nodes):
    head, target = _head(model, kind)
    drafter = _drafter(head, target, True)
    for context in _contexts()[1::3]:
        drafter.begin(DraftRequest(prompt_ids=context))
        drafter.observe(_features(target, context, drafter.feature_layers)[:-1])
        root = drafter._sync(context)
        tokens, parents, scores = (t.tolist() for t in drafter.graphs.tree(root, depth, width, nodes))
        assert len(tokens) == len(parents) == len(scores) == min(nodes, depth * width)
        assert all(-1 <= p < i for i, p in enumerate(parents))
        depths = tree_depths(parents)
        assert max(depths) <= depth and all(depths.count(d) <= width for d in set(depths))
        assert depths == sorted(depths)  # by level
        siblings = [(p, t) for p, t in zip(parents, tokens)]
        assert len(set(siblings)) == len(siblings)  # siblings are distinct tokens
        assert all(t in set(head.draft_ids.tolist()) for t in tokens)
        for i in range(len(tokens)):
            path, node = [], i
            while node >= 0:
                path.insert(0, tokens[node])
                node = parents[node]
            assert scores[i] == pytest.approx(_path_log_probs(drafter, context, path), abs=1e-4)
        if nodes < depth * width:  # the most probable nodes are kept: none of a full tree beats the least kept
            full = drafter.graphs.tree(root, depth, width, depth * width)[2]
            assert sorted(full.tolist(), reverse=True)[:nodes] == pytest.approx(sorted(scores, reverse=True))


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@pytest.mark.parametrize("tree", [False, True])
def test_speculation_with_device_drafting_equals_plain_decoding(model, kind, tree):
    head, target = _head(model, kind)
    drafter = _drafter(head, target, True, tree=tree, width=3)
    calls = []
    run = drafter.graphs._step
    drafter.graphs._step = lambda *args: calls.append(args[0]) or run(*args)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=5, adaptive=False))
    assert drafted_keeping_greedy_output(decoder, target, lengths=(4, 17), new_tokens=24) > 0
    drafted = [shape[0] for shape in calls if shape[0] != "feed"]
    assert drafted and set(drafted) == {"tree" if tree else "chain"}  # drafted on the device
    assert any(shape[0] == "feed" for shape in calls)  # each step's accepted pairs fed as a bucketed step


@pytest.mark.parametrize("kind", ["eagle", "eagle3"])
@torch.inference_mode()
def test_bucketed_feed_equals_the_eager_feed(model, kind):
    """The head cache's true pairs and the head's output after a bucketed feed of n pairs (padded to its bucket)
    equal those of one eager head pass over them, in float32, for every n up to the largest bucket."""
    head, target = _head(model, kind)
    tokens = torch.randint(0, 63, (40,), generator=torch.Generator().manual_seed(6))
    H = head.config.hidden_size
    features = head.fuse(_features(target, tokens.tolist(), tuple(head.feature_layers))[:, H if head.feature_layers else 0:])
    prefix = 11  # true pairs already in the cache, fed eagerly (the prompt)
    for n in range(1, FEED_BUCKETS[-1] + 1):
        caches = [HeadCache(head.config, features.device, head.feature_dtype, capacity=16) for _ in range(2)]
        for cache in caches:
            cache.append(head(features[None, :prefix], tokens[None, 1:prefix + 1], torch.arange(prefix)[None])[1])
        eager, bucketed = caches
        out, kv = head(features[None, prefix:prefix + n], tokens[None, prefix + 1:prefix + n + 1],
                       torch.arange(prefix, prefix + n)[None], past=eager.past())
        eager.append(kv)
        graphs = HeadGraphs(head, bucketed, capture=False)
        graphs.feed_hidden.normal_()  # padding rows hold stale pairs: the real ones must not see them
        got = graphs.feed(features[prefix:prefix + n], tokens[prefix + 1:prefix + n + 1])
        assert bucketed.length == eager.length == prefix + n
        torch.testing.assert_close(got, out[0, -1])
        for mine, theirs in zip(bucketed.past(), eager.past()):
            torch.testing.assert_close(mine, theirs)
    with pytest.raises(ValueError, match="bucketed feed"):
        graphs.feed(features[:FEED_BUCKETS[-1] + 1], tokens[1:FEED_BUCKETS[-1] + 2])


def test_device_drafter_feeds_a_steps_pairs_bucketed_and_the_prompt_eagerly(model):
    head, target = _head(model, "eagle")
    drafter = _drafter(head, target, True, tree=False)
    fed = []
    feed = drafter.graphs.feed
    drafter.graphs.feed = lambda hidden, tokens: fed.append(tokens.shape[0]) or feed(hidden, tokens)
    contexts = [c for c in _contexts() if len(c) > FEED_BUCKETS[-1] + 1]  # 18 tokens, 18 changed from 15 on, 24...
    _run(drafter, target, contexts, lambda c: Budget(3), DraftRequest(prompt_ids=contexts[0]))
    # the prompt's 17 pairs went eagerly (more than the largest bucket); the change rolled back to 14 pairs
    assert fed == [3, 9, 7, 9]
    assert drafter.cache.length == len(contexts[-1]) - 1


def test_device_drafting_needs_a_torch_head(model):
    from specdec.drafters.heads.eagle_kernels import KernelEagleHead, kernel_head_problem
    from specdec.errors import ConfigError

    head, _ = _head(model, "eagle")
    if kernel_head_problem(head.config):
        pytest.skip(kernel_head_problem(head.config))
    with pytest.raises(ConfigError, match="torch module"):
        EagleDrafter(KernelEagleHead(head), device_drafting=True)
    assert not EagleDrafter(head).device_drafting  # a head on the CPU drafts on the host unless asked


# ---- Medusa (drafters/medusa_device.py) ----------------------------------------------------------------------------
def _flat():
    from specdec.costs import CostModel

    return CostModel({1: 0.010, 64: 0.0101})  # verification as on a GPU: trees of any size pay


@pytest.mark.parametrize("tree, width", [(False, None), (True, 1), (True, 3), (True, 5)])
def test_medusa_device_drafts_are_the_host_paths_drafts(model, tree, width):
    from specdec.drafters.heads.medusa import MedusaDrafter
    from tiny import random_medusa_heads

    target = loaded(model, "torch")
    heads = random_medusa_heads(model)
    drafters = [MedusaDrafter(heads, tree=tree, width=width, device_drafting=device) for device in (False, True)]
    steps = _contexts()
    for context in steps:
        hidden = _features(target, context[:-1])
        drafts = []
        for drafter in drafters:
            drafter.begin(DraftRequest(prompt_ids=context, costs=_flat()))
            drafter.observe(hidden)
            drafts.append(drafter.propose(context, Budget(4, tree=True)))
        assert drafts[1].tokens.tolist() == drafts[0].tokens.tolist() and drafts[1].parents == drafts[0].parents
        assert len(drafts[0]) >= 4 and drafts[0].probs is None
        expected = [d.branch.head_expected for d in drafters]
        assert expected[1] == pytest.approx(expected[0], rel=1e-5)


@pytest.mark.parametrize("tree", [False, True])
def test_speculation_with_medusa_device_drafting_equals_plain_decoding(model, tree):
    from specdec.drafters.heads.medusa import MedusaDrafter
    from tiny import random_medusa_heads

    target = loaded(model, "torch", graphs="on")
    drafter = MedusaDrafter(random_medusa_heads(model), tree=tree, width=3, device_drafting=True)
    steps = []
    top = drafter.graphs.top
    drafter.graphs.top = lambda *args: steps.append(args[1:]) or top(*args)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False), costs=_flat())
    assert drafted_keeping_greedy_output(decoder, target, lengths=(4, 17), new_tokens=24) > 0
    assert steps  # drafted through the device step
