"""Sampling verification on the device (verify/device_sampling.py), run here on CPU tensors (tests/test_cuda_graphs.py runs
it on a GPU through verify() and counts the synchronisations there):
- coupled sampling gives exactly the host rules' tokens for the same noise, chains and trees;
- rejection sampling is lossless: at every position a step reaches, the token it emits follows the target's
  distribution (chi-square), for one-hot chains, chains with a drafter's q (drafts drawn from q) and trees with
  repeated tokens among siblings; a deliberately broken residual fails the same check;
- each rule reads from the device once (one .tolist()), whatever the draft;
- through the engine, with verify() taking them in place of the host rules, generations keep the target's
  distribution (rejection) and give the host rules' tokens for each seed (coupled).
"""
from collections import Counter

import pytest
import torch
from hypothesis import given, settings, strategies as st

from specdec.verify import coupled_verify, tree_coupled_verify
from specdec.verify import device_sampling
from specdec.verify.device_sampling import (chain_coupled_on_device, chain_rejection_on_device, draw_rows,
                                            tree_coupled_on_device, tree_rejection_on_device)
from stats import P_VALUE_FLOOR, fit_p_value

VOCAB = 6
SAMPLES = 4_000
ENOUGH = 300  # samples reaching a position before its distribution is checked


def random_probs(rows: int, vocab: int, seed: int, zeros: int = 1) -> torch.Tensor:
    """(rows, vocab) float32 distributions, each with `zeros` tokens of probability zero (filtered out, as top-k
    and top-p leave them)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 1.5
    for r in range(rows):
        logits[r, torch.randperm(vocab, generator=gen)[:zeros]] = float("-inf")
    return logits.softmax(-1)


def gumbel(rows: int, vocab: int, seed: int) -> torch.Tensor:
    u = torch.rand(rows, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).clamp_(min=1e-300)
    return (-torch.log(-torch.log(u))).float()


# ---- coupled sampling: the host rules' tokens ---------------------------------------------------------------
TOKENS = st.integers(0, 3)  # a vocabulary of 4: drafts often equal the target's samples


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 10), st.integers(0, 2**31), st.data())
def test_chain_coupled_on_device_gives_the_host_rules_tokens(k, seed, data):
    draft = torch.tensor(data.draw(st.lists(TOKENS, min_size=k, max_size=k)), dtype=torch.long)
    p, noise = random_probs(k + 1, 4, seed), gumbel(k + 1, 4, seed + 1)
    assert chain_coupled_on_device(draft, p, noise) == coupled_verify(draft, p, noise)


@settings(max_examples=150, deadline=None)
@given(st.integers(0, 16), st.integers(0, 2**31), st.data())
def test_tree_coupled_on_device_gives_the_host_rules_tokens(n, seed, data):
    parents = [data.draw(st.integers(-1, i - 1)) for i in range(n)]
    tokens = torch.tensor(data.draw(st.lists(TOKENS, min_size=n, max_size=n)), dtype=torch.long)
    p, noise = random_probs(n + 1, 4, seed), gumbel(n + 1, 4, seed + 1)
    assert tree_coupled_on_device(tokens, parents, p, noise) == tree_coupled_verify(tokens, parents, p, noise)


# ---- rejection sampling: the target's distribution ---------------------------------------------------------
def _check_positions(emitted: list[list[int]], p: torch.Tensor) -> int:
    """Chi-square of the token emitted at each position j against p[j], over the samples that reached j (those
    whose emitted list is longer than j). Returns the positions checked."""
    checked = 0
    for j in range(p.shape[0]):
        counts = Counter(e[j] for e in emitted if len(e) > j)
        if sum(counts.values()) < ENOUGH:
            continue
        exact = {t: float(p[j, t]) for t in range(p.shape[1])}
        assert fit_p_value(counts, exact) > P_VALUE_FLOOR, (j, counts)
        checked += 1
    return checked


def _chain_samples(p: torch.Tensor, q: torch.Tensor | None, fixed_draft: list[int] | None) -> list[list[int]]:
    """SAMPLES steps of chain rejection sampling: each step's emitted tokens (accepted drafts, then the token)."""
    gen, drafting = torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)
    out = []
    for _ in range(SAMPLES):
        # a drafter with q draws its drafts from q (the rule is lossless for those); a one-hot one drafts as it likes
        draft = torch.tensor(fixed_draft) if q is None else torch.multinomial(q, 1, generator=drafting)[:, 0]
        n, token = chain_rejection_on_device(draft, q, p, gen)
        out.append(draft[:n].tolist() + [token])
    return out


def test_chain_rejection_without_q_follows_the_target():
    p = random_probs(4, VOCAB, seed=1)
    draft = p[:3].argmax(-1).tolist()  # the likeliest tokens, so that every position is reached often
    assert _check_positions(_chain_samples(p, None, draft), p) >= 3


def test_chain_rejection_with_q_follows_the_target():
    p, q = random_probs(4, VOCAB, seed=2), random_probs(3, VOCAB, seed=3, zeros=0)
    assert _check_positions(_chain_samples(p, q, None), p) >= 3


def test_chain_rejection_with_q_equal_to_p_accepts_everything():
    p = random_probs(4, VOCAB, seed=4)
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        draft = torch.multinomial(p[:3], 1, generator=gen)[:, 0]
        assert chain_rejection_on_device(draft, p[:3].clone(), p, gen)[0] == 3


def test_a_broken_residual_fails_the_check(monkeypatch):
    """Drawing the recovered token from p itself, not from p without the rejected draft, emits the draft too often:
    the same check fails, so it can tell."""
    p = random_probs(2, VOCAB, seed=1)
    monkeypatch.setattr(device_sampling, "_or_target", lambda residual, target: target)
    emitted = _chain_samples(p, None, [int(p[0].argmax())])
    with pytest.raises(AssertionError):
        _check_positions(emitted, p)


TREE_PARENTS = [-1, -1, -1, 0, 0, 1, 3, 3]  # three under the root, two under node 0, one under 1, two under 3


def test_tree_rejection_follows_the_target():
    """Rows reached along the path each emit a token that follows their own row of p; the tree repeats a token
    among the root's children (nodes 0 and 2), which the rule must try only once."""
    p = random_probs(len(TREE_PARENTS) + 1, VOCAB, seed=5)
    order = p.argsort(-1, descending=True)
    first, second = int(order[0, 0]), int(order[0, 1])
    tokens = torch.tensor([first, second, first, int(order[1, 0]), int(order[1, 1]), int(order[2, 0]),
                           int(order[4, 0]), int(order[4, 2])])
    gen, by_row = torch.Generator().manual_seed(9), {}
    for _ in range(SAMPLES):
        path, token = tree_rejection_on_device(tokens, TREE_PARENTS, p, gen)
        rows = [0] + [node + 1 for node in path]
        for row, emitted in zip(rows, [int(tokens[node]) for node in path] + [token]):
            by_row.setdefault(row, []).append(emitted)
        assert all(TREE_PARENTS[b] == a for a, b in zip([-1] + path, path))  # a path down the tree
    checked = 0
    for row, emitted in by_row.items():
        if len(emitted) >= ENOUGH:
            exact = {t: float(p[row, t]) for t in range(VOCAB)}
            assert fit_p_value(Counter(emitted), exact) > P_VALUE_FLOOR, row
            checked += 1
    assert checked >= 3


def test_draws_by_the_inverse_distribution():
    probs = torch.tensor([[0.0, 0.25, 0.0, 0.75], [2.0, 0.0, 0.0, 0.0]])  # a row need not sum to 1
    assert draw_rows(probs, torch.tensor([0.0, 0.5], dtype=torch.float64)).tolist() == [1, 0]
    assert draw_rows(probs, torch.tensor([0.3, 0.999], dtype=torch.float64)).tolist() == [3, 0]
    assert draw_rows(probs, torch.tensor([1.0, 1.0], dtype=torch.float64)).tolist() == [3, 0]  # u * mass == mass


# ---- one host read per step ---------------------------------------------------------------------------------
HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "nonzero", "cpu")


@pytest.fixture
def host_reads(monkeypatch):
    """The names of the tensor methods that read values back to the host, in call order, as they are called (on a
    GPU each is a synchronisation)."""
    calls = []
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return calls


@pytest.mark.parametrize("k", [0, 1, 5])
def test_each_rule_reads_from_the_device_once(host_reads, k):
    p, q, noise = random_probs(k + 1, VOCAB, seed=k), random_probs(k, VOCAB, seed=9, zeros=0), gumbel(k + 1, VOCAB, 3)
    draft = p[:k].argmax(-1)
    parents = [i - 1 for i in range(k)]  # a chain as a tree
    gen = torch.Generator().manual_seed(0)
    rules = [lambda: chain_rejection_on_device(draft, None, p, gen),
             lambda: chain_rejection_on_device(draft, q, p, gen),
             lambda: chain_coupled_on_device(draft, p, noise), lambda: tree_rejection_on_device(draft, parents, p, gen),
             lambda: tree_coupled_on_device(draft, parents, p, noise)]
    for rule in rules:
        host_reads.clear()
        rule()
        assert len(host_reads) == 1, host_reads


def test_the_host_rules_read_more_often(host_reads):
    """What the count tells: the host rule it replaces reads once per decision (the first rejection, the residual's
    mass, the drawn token)."""
    from specdec.verify import rejection_verify

    p = random_probs(4, VOCAB, seed=1)
    draft = torch.tensor([int(p[0].argmin()), 0, 0])  # the first draft is rejected: a residual is drawn
    rejection_verify(draft, None, p, torch.Generator().manual_seed(0))
    assert len(host_reads) > 1


# ---- through the engine: the device rules in place of the host rules -------------------------------------------
def use_device_rules(monkeypatch) -> Counter:
    """verify() takes the device rules on the CPU too (it takes them where the logits are on a GPU). Returns the
    count of calls to each, as they are made."""
    import specdec.verify as verify_module

    calls = Counter()
    for host, device in (("rejection_verify", chain_rejection_on_device), ("coupled_verify", chain_coupled_on_device),
                         ("tree_rejection_verify", tree_rejection_on_device),
                         ("tree_coupled_verify", tree_coupled_on_device)):
        def counted(*args, _rule=device, _name=device.__name__):
            calls[_name] += 1
            return _rule(*args)

        monkeypatch.setattr(verify_module, host, counted)
    return calls


@pytest.fixture
def device_rules(monkeypatch):
    return use_device_rules(monkeypatch)


@pytest.mark.parametrize("kind", ["draft", "tree"])
def test_generation_with_the_device_rules_follows_the_target(device_rules, kind):
    """Whole generations (three tokens, several steps) through the engine, as tests/test_sampling_lossless.py
    checks the host rules (with more settings): a draft model's q, and trees with one-hot drafts, under top-k."""
    from test_sampling_lossless import PROMPT, NEW_TOKENS, SETTINGS, decoder_for, draw, exact_distribution

    sampling = SETTINGS[1]
    decoder = decoder_for(kind)
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling, samples=3_000), exact) > P_VALUE_FLOOR
    assert device_rules["tree_rejection_on_device" if kind == "tree" else "chain_rejection_on_device"] > 0


def test_coupled_generation_with_the_device_rules_is_the_host_rules(monkeypatch):
    """The same seed gives the same tokens with the device rules and the host rules, speculative or not."""
    from dataclasses import replace

    from specdec.config import GenerationConfig
    from test_sampling_lossless import PROMPT, SETTINGS, decoder_for

    config = lambda seed: GenerationConfig(max_new_tokens=10, ignore_eos=True,  # noqa: E731
                                           sampling=replace(SETTINGS[seed % 2 * 5], seed=seed))
    decoders = [decoder_for(kind, verifier="coupled") for kind in ("none", "ngram", "draft", "tree")]
    want = [[d.generate_ids(PROMPT, config(seed))[0] for d in decoders] for seed in range(40)]
    calls = use_device_rules(monkeypatch)
    assert [[d.generate_ids(PROMPT, config(seed))[0] for d in decoders] for seed in range(40)] == want
    assert calls["chain_coupled_on_device"] > 0 and calls["tree_coupled_on_device"] > 0
