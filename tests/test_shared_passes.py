"""Chains of a batch drafted in shared passes. EAGLE: a head pass over several sequences' new pairs gives each row
what it gets alone, several requests' chains drafted together are the chains each drafts alone, and a batch drafting
so keeps every sequence's greedy output. Medusa: the heads run once for every request's chain. Layer-skip: the early
exit's passes over several sequences are the target's own batched passes."""

import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.drafters.base import Budget, DraftJob, DraftRequest
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle3_head import new_eagle3_head
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.heads.eagle_kernels import KernelEagle3Head, KernelEagleHead, kernel_head_problem
from specdec.drafters.heads.medusa import MedusaDrafter
from specdec.drafters.heads.medusa_kernels import KernelMedusaHeads, kernel_heads_problem
from specdec.drafters.registry import create_drafter
from specdec.engine import SpecDecoder
from specdec.speculation_config import SpeculationConfig
from tiny import loaded, random_medusa_heads, tiny_llama

LAYERS = (2, 4, 5)  # an EAGLE-3 head's feature layers, of its target's 8


def _noisy(head, seed: int):
    """A new head's weights with noise, so that its drafts vary along a chain and between requests."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return head.eval()


def _kernel_head(kind: str, bits: int = 0):
    """A random head of this kind on the CPU kernels (bits 8: its weights in 8-bit groups, as over a GGUF
    target), for a tiny Llama whose shapes the kernels take."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2, layers=8 if kind == "eagle3" else 2)
    if kind == "eagle3":
        head = _noisy(new_eagle3_head(model, "tiny", torch.arange(1, 64, 2), feature_layers=LAYERS), 2)
    else:
        head = _noisy(new_head(model, "tiny", torch.arange(64)), 2)
    if kernel_head_problem(head.config):
        pytest.skip(f"the CPU kernels cannot run here: {kernel_head_problem(head.config)}")
    return model, (KernelEagle3Head if kind == "eagle3" else KernelEagleHead)(head, bits=bits)


@pytest.mark.parametrize("kind,bits", [("eagle", 0), ("eagle", 8), ("eagle3", 0)])
def test_a_head_pass_over_several_sequences_gives_each_row_what_it_gets_alone(kind, bits):
    """Rows of four sequences with pasts of 0, 3, 7 and 12 pairs (one held in a longer buffer) in one call: each
    row's output, keys and values are those of the head over that row alone with its past, bit for bit."""
    _, head = _kernel_head(kind, bits)
    c = head.config
    torch.manual_seed(3)
    pasts = [None] + [tuple(torch.randn(1, c.num_kv_heads, S, c.head_dim) for _ in range(2)) for S in (3, 7)]
    longer = tuple(torch.randn(1, c.num_kv_heads, 20, c.head_dim) for _ in range(2))
    pasts.append((longer[0][:, :, :12], longer[1][:, :, :12]))
    width = c.hidden_size * (len(head.feature_layers) or 1)
    features = head.fuse(torch.randn(4, width))
    tokens, positions = head.draft_ids[torch.tensor([1, 5, 9, 2])], torch.tensor([0, 3, 7, 12])
    with torch.no_grad():
        together, kvs = head.each(features, tokens, positions, pasts)
        for b, past in enumerate(pasts):
            alone, (keys, values) = head(features[b][None, None], tokens[b].view(1, 1), positions[b].view(1, 1), past)
            assert torch.equal(together[b], alone[0, 0])
            assert torch.equal(kvs[b][0], keys) and torch.equal(kvs[b][1], values)
        logits = head.draft_logits(together)
        assert torch.equal(torch.cat([head.draft_logits(together[b : b + 1]) for b in range(4)]), logits)


def _drafters(root, contexts: list[list[int]], features: list[torch.Tensor] | None = None, **sampling):
    """A fork of root (a drafter) for each context, begun on it and given its features where there are any."""
    out = []
    for i, context in enumerate(contexts):
        drafter = root.fork()
        drafter.begin(DraftRequest(prompt_ids=context, sampling=SamplingConfig(**sampling)))
        if features is not None:
            drafter.observe(features[i])
        out.append(drafter)
    return out


@pytest.mark.parametrize("kind,bits", [("eagle", 0), ("eagle", 8), ("eagle3", 0)])
def test_eagle_chains_of_a_batch_draft_in_shared_passes_the_chains_each_would_alone(kind, bits):
    """Greedy requests whose drafters share a kernel head draft their chains together, one head pass a drafted
    token over every chain still drafting, and each gets the chain it drafts alone; then again after each context
    grew by a few tokens, whose pairs the heads' caches are fed together in one pass first (over the first step's
    drafts, past the true pairs); sampled and penalized requests draft alone, as does a head that is a torch
    module."""
    model, head = _kernel_head(kind, bits)
    root = EagleDrafter(head, tree=False)
    gen = torch.Generator().manual_seed(7)
    contexts = [torch.randint(0, 64, (n,), generator=gen).tolist() for n in (5, 9, 3, 12)]
    width = model.config.hidden_size * (1 + len(head.feature_layers))
    features = [torch.randn(len(c), width, generator=gen) for c in contexts]
    ks = [5, 2, 6, 4]
    together = _drafters(root, contexts, features)
    shared = together[0].pass_sharing()
    assert shared is not None and all(d.pass_sharing() is shared for d in together)  # one table for every fork
    assert root.pass_sharing() is None  # drafting for no request
    passes = []  # sequences in each head pass
    each = head.each
    head.each = lambda feats, tokens, positions, pasts, *counts: (
        passes.append(len(pasts)) or each(feats, tokens, positions, pasts, *counts)
    )
    chain_passes = [sum(k > depth for k in ks) for depth in range(1, max(ks))]
    for grown in (0, 1):
        if grown:  # each request accepted a few tokens: their features arrive, their pairs are fed next step
            for i, (d, n) in enumerate(zip(together, (1, 3, 2, 1))):
                contexts[i] = contexts[i] + torch.randint(0, 64, (n,), generator=gen).tolist()
                new = torch.randn(n, width, generator=gen)
                features[i] = torch.cat([features[i], new])
                d.observe(new)
        passes.clear()
        made = together[0].propose_together([DraftJob(d, c, k) for d, c, k in zip(together, contexts, ks)])
        alone = [d.propose(c, Budget(k)) for d, c, k in zip(_drafters(root, contexts, features), contexts, ks)]
        assert [m.tokens.tolist() for m in made] == [a.tokens.tolist() for a in alone]
        assert [len(m) for m in made] == ks
        assert passes == [len(ks)] * grown + chain_passes  # the new pairs fed together, then each depth
    assert len({tuple(m.tokens.tolist()) for m in made}) > 1  # the requests' chains differ
    sampled = _drafters(root, contexts[:1], features[:1], temperature=1.0)[0]
    penalized = _drafters(root, contexts[:1], features[:1], repetition_penalty=1.3)[0]
    assert sampled.pass_sharing() is None and penalized.pass_sharing() is None
    torch_head = EagleDrafter(new_head(model, "tiny", torch.arange(64)), tree=False)
    torch_head.begin(DraftRequest(prompt_ids=contexts[0]))
    assert torch_head.pass_sharing() is None


def test_a_batch_drafting_eagle_chains_together_keeps_every_greedy_output(monkeypatch):
    """Four sequences decoded together on the kernels, a kernel head drafting 3 tokens each a step: their chains
    are drafted in shared passes, and every output is its plain greedy decoding."""
    model, head = _kernel_head("eagle", bits=0)
    target = loaded(model, "kernels")
    drafter = EagleDrafter(head, tree=True, width=3)
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=3, adaptive=False))
    config = GenerationConfig(max_new_tokens=20, ignore_eos=True)
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 63, (n,), generator=gen).tolist() for n in (4, 9, 6, 13)]
    want = [SpecDecoder(target, None).generate_ids(p, config)[0] for p in prompts]
    together = []
    propose_together = EagleDrafter.propose_together
    monkeypatch.setattr(
        EagleDrafter, "propose_together", lambda self, jobs: together.append(len(jobs)) or propose_together(self, jobs)
    )
    engine = decoder.batch_engine(max_batch=4)
    for i, p in enumerate(prompts):
        engine.submit(i, p, config)
    got: dict[int, list[int]] = {}
    while len(engine):
        for event in engine.step():
            got.setdefault(event.request_id, []).extend(event.new_tokens)
    assert [got[i] for i in range(len(prompts))] == want
    assert together and max(together) == len(prompts)


def test_medusa_chains_of_a_batch_are_drafted_in_one_pass_of_the_heads_each_as_alone():
    """Greedy requests whose drafters share kernel Medusa heads: one pass of the heads over every request that needs
    them, each chain the one it drafts alone; a request whose last feature is unknown, or given no tokens, drafts
    nothing; sampled requests draft alone."""
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    heads = random_medusa_heads(model)
    if kernel_heads_problem(heads):
        pytest.skip(f"the CPU kernels cannot run here: {kernel_heads_problem(heads)}")
    fast = KernelMedusaHeads(heads)
    root = MedusaDrafter(fast, tree=False, lookup=False)
    gen = torch.Generator().manual_seed(3)
    contexts = [torch.randint(0, 64, (n,), generator=gen).tolist() for n in (5, 9, 3, 12, 7)]
    features = [torch.randn(len(c) - 1, 64, generator=gen) for c in contexts]
    features[4] = features[4][:-1]  # the feature that gave this context's last token has not arrived
    ks = [4, 2, 3, 0, 4]

    together = _drafters(root, contexts, features)
    shared = together[0].pass_sharing()
    assert shared is not None and all(d.pass_sharing() is shared for d in together)
    runs = []
    call = KernelMedusaHeads.__call__
    KernelMedusaHeads.__call__ = lambda self, f: runs.append(f.shape[0]) or call(self, f)
    try:
        made = together[0].propose_together([DraftJob(d, c, k) for d, c, k in zip(together, contexts, ks)])
        assert runs == [3]  # one pass, over the three requests that need the heads
        alone = [d.propose(c, Budget(k)) for d, c, k in zip(_drafters(root, contexts, features), contexts, ks)]
    finally:
        KernelMedusaHeads.__call__ = call
    assert [m.tokens.tolist() for m in made] == [a.tokens.tolist() for a in alone]
    assert [len(m) for m in made] == [4, 2, 3, 0, 0]
    assert _drafters(root, contexts, features, temperature=1.0)[0].pass_sharing() is None


def test_layer_skip_drafts_a_batch_in_the_targets_own_batched_passes():
    """The early exit runs several sequences in one pass of the target's first layers (its backend's forward_batch),
    so that layer-skip shares passes as a draft model does: one pass a drafted token, each chain as alone."""
    target = loaded(tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2), "kernels")
    root = create_drafter("layerskip", target, layerskip_layers=1)
    assert root.draft.batched and root.draft.backend is target.backend
    gen = torch.Generator().manual_seed(9)
    contexts = [torch.randint(0, 64, (n,), generator=gen).tolist() for n in (4, 7, 3)]
    ks = [3, 1, 4]

    together = _drafters(root, contexts)
    assert together[0].pass_sharing() is not None
    passes = []
    forward_batch = target.backend.forward_batch
    target.backend.forward_batch = lambda caches, ids, **kw: passes.append((len(ids), kw["layers"])) or forward_batch(
        caches, ids, **kw
    )
    try:
        made = together[0].propose_together([DraftJob(d, c, k) for d, c, k in zip(together, contexts, ks)])
    finally:
        target.backend.forward_batch = forward_batch
    alone = [d.propose(c, Budget(k)) for d, c, k in zip(_drafters(root, contexts), contexts, ks)]
    assert [m.tokens.tolist() for m in made] == [a.tokens.tolist() for a in alone]
    assert passes == [(3, 1), (2, 1), (2, 1), (1, 1)]  # one pass of the first layer a depth, every chain in it
