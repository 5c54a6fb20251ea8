"""Speculative sampling is lossless: generated tokens follow the target's exact distribution.

A toy target over a 5-token vocabulary (logits from a table of the previous two tokens) lets the
real engine draw 6,000 three-token continuations per setting in seconds; their empirical
distribution must pass a chi-square test against the exact one, for each drafter and several
temperature / top-k / top-p / min-p / penalty settings. A deliberately broken acceptance rule must fail the
same test.
"""
import itertools
from collections import Counter
from dataclasses import replace

import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.heads.medusa import MedusaDrafter
from specdec.drafters.heads.medusa_head import MedusaConfig, MedusaHeads
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.recycle import RecycleDrafter
from specdec.drafters.routing.select import SelectingDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.engine import SpecDecoder
from specdec.sampling import probs_from_logits
from specdec.verify import rejection_verify
from stats import P_VALUE_FLOOR, fit_p_value
from tiny import TableLM, TableTreeDrafter, table_target

VOCAB, NEW_TOKENS, SAMPLES = 5, 3, 6_000
PROMPT = [1, 3, 1, 3, 2]
SETTINGS = [
    SamplingConfig(temperature=1.0),
    SamplingConfig(temperature=0.7, top_k=3),
    SamplingConfig(temperature=1.3, top_p=0.8),
    SamplingConfig(temperature=1.0, top_k=4, top_p=0.9),
    SamplingConfig(temperature=1.0, min_p=0.2, repetition_penalty=1.8, logit_bias=((2, 1.5),)),
    SamplingConfig(temperature=0.8, frequency_penalty=0.9, presence_penalty=0.6),
]


def penalized_reference(logits: torch.Tensor, prompt: list[int], output: list[int], s: SamplingConfig) -> torch.Tensor:
    """The penalties written out token by token, as their sources define them: logits (V,) -> (V,)."""
    x = logits.clone().float()
    for token, bias in s.logit_bias:
        x[token] += bias
    for token in set(prompt + output):  # transformers' RepetitionPenaltyLogitsProcessor
        x[token] = x[token] / s.repetition_penalty if x[token] > 0 else x[token] * s.repetition_penalty
    for token in set(output):  # OpenAI: mu[j] - c[j] * frequency - (c[j] > 0) * presence
        x[token] -= output.count(token) * s.frequency_penalty + s.presence_penalty
    return x


def exact_distribution(lm: TableLM, prompt: list[int], n: int, sampling: SamplingConfig) -> dict:
    """P(continuation) for every continuation of n tokens, from the target's own sampler chain."""
    out = {}
    for seq in itertools.product(range(VOCAB), repeat=n):
        prob, context = 1.0, list(prompt)
        for t in seq:
            logits = penalized_reference(lm.logits_after(context), prompt, context[len(prompt):], sampling)
            prob *= float(probs_from_logits(logits[None], sampling)[0, t])
            context.append(t)
        out[seq] = prob
    return out


def draw(decoder: SpecDecoder, sampling: SamplingConfig, samples: int = SAMPLES, length: int = NEW_TOKENS) -> Counter:
    counts = Counter()
    for seed in range(samples):
        config = GenerationConfig(max_new_tokens=length, ignore_eos=True,
                                  sampling=replace(sampling, seed=seed))
        tokens, _ = decoder.generate_ids(PROMPT, config)
        counts[tuple(tokens)] += 1
    return counts


def make_drafter(kind: str):
    if kind == "tree":
        return TableTreeDrafter(TableLM(VOCAB, seed=11, scale=2.5), width=2, depth=2)
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=2)
    if kind == "suffix":  # drafts from the samples drawn before: the distribution must not shift with them
        return SuffixDrafter(min_n=1, max_n=3)
    if kind == "recycle":  # chains from the target's choices at every row scored before, samples included
        return RecycleDrafter(min_n=1, max_n=2)
    if kind == "self":
        return DraftModelDrafter(TableLM(VOCAB, seed=0), VOCAB)  # q == p: everything accepted
    if kind == "draft-p-min":  # the unrelated draft, stopping after a token it drew with q < 0.5 (from PROMPT at
        # T=1, 88 of 300 three-token drafts stopped early)
        return DraftModelDrafter(TableLM(VOCAB, seed=11, scale=2.5), VOCAB, p_min=0.5)
    if kind.startswith("medusa"):  # random heads on the table target's features: chains with q, or trees
        return MedusaDrafter(random_medusa_heads(), tree=kind == "medusa-tree", width=2)
    if kind == "select":  # the select drafter's steps, drafted in turn by a tree, a chain with q, a one-hot chain
        return RotatingSelection([make_drafter("tree"), make_drafter("medusa"), make_drafter("ngram")])
    return DraftModelDrafter(TableLM(VOCAB, seed=11, scale=2.5), VOCAB)  # an unrelated draft


class RotatingSelection(SelectingDrafter):
    """The select drafter with its candidates chosen in turn, step after step and request after request (its own
    choice settles on one candidate within these 3-token requests)."""

    turn = -1

    def _choose(self) -> str:
        self.turn += 1
        return list(self.candidates)[self.turn % len(self.candidates)]


def random_medusa_heads() -> MedusaHeads:
    hidden = table_target(VOCAB, seed=0).info.hidden_size
    config = MedusaConfig(target="table", target_fingerprint=None, hidden_size=hidden, num_heads=NEW_TOKENS,
                          num_layers=1, vocab_size=VOCAB, draft_vocab_size=VOCAB)
    gen = torch.Generator().manual_seed(5)
    heads = MedusaHeads(config, torch.randn(VOCAB, hidden, generator=gen) * 0.7, torch.arange(VOCAB))
    with torch.no_grad():
        for p in heads.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return heads


def decoder_for(kind: str, verifier: str = "rejection", k: int = 3) -> SpecDecoder:
    drafter = None if kind == "none" else make_drafter(kind)
    return SpecDecoder(table_target(VOCAB, seed=0), drafter,
                       SpeculationConfig(num_speculative_tokens=k, adaptive=False, sampling_verifier=verifier))


def _setting_id(s: SamplingConfig) -> str:
    return f"T{s.temperature}-k{s.top_k}-p{s.top_p}" + ("-penalties" if s.penalized else "")


# Every setting for the drafters whose verification differs most (a draft model's q, multi-draft trees); for the
# others (Medusa trees included: the tree rule of "tree", with the heads' q) a setting of each kind of warper
# (plain, top-p, penalties), to keep the file's time down.
FULL_KINDS, SOME_KINDS = ["draft", "tree"], ["none", "ngram", "suffix", "self", "medusa", "medusa-tree"]
REJECTION_CASES = ([(kind, s) for kind in FULL_KINDS for s in SETTINGS]
                   + [(kind, SETTINGS[i]) for kind in SOME_KINDS for i in (0, 2, 4)])


@pytest.mark.parametrize("kind,sampling", REJECTION_CASES,
                         ids=[f"{kind}-{_setting_id(s)}" for kind, s in REJECTION_CASES])
def test_rejection_sampling_matches_target_distribution(kind, sampling):
    decoder = decoder_for(kind)
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    counts = draw(decoder, sampling)
    assert fit_p_value(counts, exact) > P_VALUE_FLOOR


@pytest.mark.parametrize("kind", ["draft", "ngram", "self"])
def test_rejection_sampling_with_two_drafted_positions(kind):
    """Four tokens: the first step drafts two (the other tests' three tokens leave room for one draft a step), so an
    accepted first draft is followed by a second checked against it."""
    sampling = SETTINGS[4]
    decoder = decoder_for(kind)
    exact = exact_distribution(decoder.target.backend, PROMPT, 4, sampling)
    assert fit_p_value(draw(decoder, sampling, length=4), exact) > P_VALUE_FLOOR


def test_confidence_stop_keeps_the_target_distribution():
    """A draft cut short where q of a drawn token is below p_min: its length depends on the tokens drawn (coupled
    mode: test_coupled_sampling_is_seed_stable)."""
    sampling = SETTINGS[0]
    decoder = decoder_for("draft-p-min")
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) > P_VALUE_FLOOR


@pytest.mark.parametrize("sampling", [SETTINGS[1], SETTINGS[4]], ids=_setting_id)
@pytest.mark.parametrize("kind", ["none", "ngram", "draft", "tree", "medusa"])
def test_coupled_sampling_matches_target_distribution(kind, sampling):
    decoder = decoder_for(kind, verifier="coupled")
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) > P_VALUE_FLOOR


@pytest.mark.parametrize("verifier,sampling", [("rejection", SETTINGS[1]), ("rejection", SETTINGS[4]),
                                               ("coupled", SETTINGS[4])])
def test_select_sampling_matches_target_distribution(verifier, sampling):
    """The select drafter's steps, drafted in turn by a tree, a chain carrying q and a one-hot chain."""
    decoder = decoder_for("select", verifier=verifier)
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) > P_VALUE_FLOOR


def test_coupled_sampling_is_seed_stable():
    """The same seed gives the same tokens with and without speculation (a drafter changes only speed)."""
    plain = decoder_for("none", verifier="coupled")
    speculative = [decoder_for(kind, verifier="coupled", k=k)
                   for kind in ("ngram", "draft", "draft-p-min", "self", "tree", "medusa") for k in (1, 4)]
    for seed in range(200):
        sampling = SETTINGS[0] if seed % 2 else SETTINGS[5]  # penalties keep it seed-stable too
        config = GenerationConfig(max_new_tokens=12, ignore_eos=True, sampling=replace(sampling, seed=seed))
        want, _ = plain.generate_ids(PROMPT, config)
        for decoder in speculative:
            assert decoder.generate_ids(PROMPT, config)[0] == want


def test_same_seed_same_output():
    decoder = decoder_for("draft")
    config = GenerationConfig(max_new_tokens=10, ignore_eos=True, sampling=SamplingConfig(temperature=1.0, seed=5))
    assert decoder.generate_ids(PROMPT, config)[0] == decoder.generate_ids(PROMPT, config)[0]


def _accept_all(draft, draft_probs, target_probs, generator):
    """Broken: keeps every draft token (target never checks)."""
    return len(draft), int(torch.multinomial(target_probs[len(draft)], 1, generator=generator))


def _resample_from_p(draft, draft_probs, target_probs, generator):
    """Broken: the right acceptance test, but a rejected position is redrawn from p, not norm(max(0, p - q))."""
    n, _ = rejection_verify(draft, draft_probs, target_probs, generator)
    return n, int(torch.multinomial(target_probs[n], 1, generator=generator))


@pytest.mark.parametrize("broken", [_accept_all, _resample_from_p])
def test_broken_acceptance_rule_is_caught(monkeypatch, broken):
    from specdec import verify

    monkeypatch.setattr(verify, "rejection_verify", broken)
    sampling = SETTINGS[0]
    decoder = decoder_for("draft")
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) < P_VALUE_FLOOR


def test_warp_logits_matches_transformers_warpers():
    """The sampler chain keeps the same tokens as transformers' temperature, top-k and top-p warpers."""
    from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                        TopKLogitsWarper, TopPLogitsWarper)

    from specdec.sampling import warp_logits

    gen = torch.Generator().manual_seed(0)
    for temperature, top_k, top_p in [(0.7, 0, 1.0), (1.0, 5, 1.0), (1.2, 0, 0.9), (0.9, 20, 0.5), (1.0, 1, 1.0)]:
        logits = torch.randn(4, 100, generator=gen) * 3
        chain = LogitsProcessorList([TemperatureLogitsWarper(temperature)] +
                                    ([TopKLogitsWarper(top_k)] if top_k else []) +
                                    ([TopPLogitsWarper(top_p)] if top_p < 1 else []))
        want = chain(None, logits.clone())
        got = warp_logits(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        torch.testing.assert_close(got.softmax(-1), want.softmax(-1))


def test_penalties_without_the_drafts_counts_are_caught(monkeypatch):
    """Broken: every scored row gets the counts of the accepted text only, not those of the drafts before it."""
    from specdec.penalties import TokenHistory

    rows = TokenHistory.rows
    monkeypatch.setattr(TokenHistory, "rows", lambda self, tokens, ancestors: rows(self, tokens, ancestors & False))
    sampling = SETTINGS[5]
    decoder = decoder_for("self")  # drafts from the unpenalized target: many accepted, so later rows matter
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) < P_VALUE_FLOOR


def _tree_accept_always(tokens, parents, target_probs, generator):
    """Broken: follows the first child at every level without checking it."""
    kids, path, node = {}, [], -1
    for i, p in enumerate(parents):
        kids.setdefault(p, []).append(i)
    while kids.get(node):
        node = kids[node][0]
        path.append(node)
    return path, int(torch.multinomial(target_probs[node + 1], 1, generator=generator))


def test_broken_tree_rule_is_caught(monkeypatch):
    from specdec import verify

    monkeypatch.setattr(verify, "tree_rejection_verify", _tree_accept_always)
    sampling = SETTINGS[0]
    decoder = decoder_for("tree")
    exact = exact_distribution(decoder.target.backend, PROMPT, NEW_TOKENS, sampling)
    assert fit_p_value(draw(decoder, sampling), exact) < P_VALUE_FLOOR


@pytest.mark.parametrize("kind", ["ngram", "draft", "tree"])
def test_a_seed_gives_one_text_by_default_whatever_is_drafted(kind):
    """The default verifier ("auto") verifies a request with a seed by coupled sampling: the same seed gives the same
    text with drafts of any length, and without any; rejection sampling, asked for by name, does not promise it."""
    default = SpeculationConfig()
    assert default.sampling_verifier == "auto"
    config = GenerationConfig(max_new_tokens=12, ignore_eos=True,
                              sampling=SamplingConfig(temperature=0.9, seed=7))
    texts = set()
    for k in (0, 1, 4):
        drafter = make_drafter(kind) if k else None
        decoder = SpecDecoder(table_target(VOCAB, seed=0), drafter, replace(default, num_speculative_tokens=k,
                                                                               adaptive=False))
        texts.add(tuple(decoder.generate_ids([1, 2, 3], config)[0]))
    assert len(texts) == 1
    unseeded = replace(config.sampling, seed=None)
    assert default.verifier_for(unseeded) == "rejection" and default.verifier_for(config.sampling) == "coupled"
