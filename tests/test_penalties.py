"""Penalties and logit bias: the same logits as their reference definitions, and speculation stays exact with them.

Row r of a verify pass must see the counts of the drafts before it; greedy outputs with penalties equal
transformers' own `generate(repetition_penalty=...)` and plain decoding, for chains, trees and batches.
(Sampling with penalties is covered by the chi-square tests of test_sampling_lossless.py.)
"""
import pytest
import torch

from specdec.config import GenerationConfig, SamplingConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from specdec.penalties import TokenHistory, chain_ancestors, penalize, tree_ancestors
from tiny import ModelLogits, TableTreeDrafter, loaded, tiny_llama

PROMPT = [5, 9, 11, 5, 9, 11, 5, 9, 2, 7, 5, 9]


@pytest.fixture(scope="module")
def target_model():
    model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)
    model.generation_config.eos_token_id = None  # transformers' generate runs the full length, like ignore_eos
    model.generation_config.pad_token_id = 0
    return model


def test_penalize_example():
    logits = torch.tensor([[2.0, -1.0, 0.0, 1.0]])
    counts = torch.tensor([[2.0, 0.0, 0.0, 1.0]])  # output: token 0 twice, token 3 once
    seen = torch.tensor([[True, True, False, True]])  # token 1 in the prompt only
    cfg = SamplingConfig(repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, logit_bias=((2, 3.0),))
    got = penalize(logits, counts, seen, cfg)
    # 0: 2 / 2 - 2 * 0.5 - 0.25; 1: -1 * 2 (prompt: no output penalties); 2: 0 + 3 (bias); 3: 1 / 2 - 0.5 - 0.25
    assert torch.equal(got, torch.tensor([[-0.25, -2.0, 3.0, -0.25]]))


@pytest.mark.parametrize("penalty", [5e-324, 1e-38, 100.0])
def test_extreme_repetition_penalties_keep_the_logits_finite_and_sampling_defined(target_model, penalty):
    logits = torch.tensor([[3.0e38, 2.0, -1.0, -3.0e38]])
    seen = torch.ones_like(logits, dtype=torch.bool)
    got = penalize(logits, torch.zeros_like(logits), seen, SamplingConfig(repetition_penalty=penalty))
    assert torch.isfinite(got).all() and torch.isfinite(torch.softmax(got, -1)).all()
    decoder = SpecDecoder(loaded(target_model), NgramDrafter())
    ids, _ = decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=6, temperature=1.0, seed=1,
                                                                  repetition_penalty=penalty))
    assert len(ids) == 6


def test_repetition_penalty_matches_transformers_processor():
    from transformers.generation.logits_process import RepetitionPenaltyLogitsProcessor

    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=gen) * 3
    context = torch.randint(0, 50, (3, 12), generator=gen)
    want = RepetitionPenaltyLogitsProcessor(1.7)(context, logits.clone())
    seen = torch.zeros(3, 50, dtype=torch.bool).scatter(1, context, True)
    got = penalize(logits, torch.zeros(3, 50), seen, SamplingConfig(repetition_penalty=1.7))
    torch.testing.assert_close(got, want)


def test_rows_count_the_drafts_on_each_path():
    history = TokenHistory([1, 2], vocab_size=8)
    history.extend([3, 3])
    tokens = torch.tensor([4, 3, 5, 4])
    parents = [-1, 0, -1, 2]  # root -> 4 -> 3;  root -> 5 -> 4
    counts, seen = history.rows(tokens, tree_ancestors(parents))
    paths = [[], [4], [4, 3], [5], [5, 4]]  # row 0 is the root, row i + 1 follows node i
    for row, path in enumerate(paths):
        output = [3, 3] + path
        assert counts[row].tolist() == [float(output.count(t)) for t in range(8)]
        assert seen[row].tolist() == [t in [1, 2] + output for t in range(8)]
    assert torch.equal(tree_ancestors([-1, 0, 1]), chain_ancestors(3))


def test_config_refuses_bad_values():
    for bad in (dict(repetition_penalty=0.0), dict(frequency_penalty=2.5), dict(presence_penalty=-3.0),
                dict(min_p=1.5), dict(logit_bias={-1: 1.0}), dict(logit_bias={3: 101.0}), dict(logit_bias={"3": 1.0}),
                dict(logit_bias=[(3, 1.0)])):
        with pytest.raises(ConfigError):
            GenerationConfig.create(**bad)


def _drafters(target_model, backend):
    return {"ngram": NgramDrafter(min_n=1, max_n=3),
            "self": DraftModelDrafter(loaded(target_model, backend).backend, target_model.config.vocab_size),
            "tree": TableTreeDrafter(ModelLogits(target_model), width=2, depth=3)}  # the target's top 2 per node


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_greedy_repetition_penalty_equals_transformers(target_model, backend):
    target = loaded(target_model, backend)
    config = GenerationConfig.create(max_new_tokens=30, ignore_eos=True, repetition_penalty=1.5)
    want = target_model.generate(torch.tensor([PROMPT]), max_new_tokens=30, do_sample=False,
                                 repetition_penalty=1.5)[0, len(PROMPT):].tolist()
    plain, _ = SpecDecoder(target, None).generate_ids(PROMPT, GenerationConfig(max_new_tokens=30, ignore_eos=True))
    assert want != plain  # the penalty changes this output
    assert SpecDecoder(target, None).generate_ids(PROMPT, config)[0] == want
    for name, drafter in _drafters(target_model, backend).items():
        spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
        got, metrics = spec.generate_ids(PROMPT, config)
        assert got == want, name
        if name in ("self", "tree"):
            assert metrics.accepted_tokens > 0
        if name == "self":  # a draft model applies the request's penalties too: the target drafting is always right
            assert metrics.accepted_tokens == metrics.drafted_tokens


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_greedy_penalties_and_bias_keep_speculation_exact(target_model, backend):
    target = loaded(target_model, backend)
    settings = [dict(frequency_penalty=1.0), dict(presence_penalty=2.0, repetition_penalty=1.2),
                dict(frequency_penalty=-0.5, logit_bias={7: 2.5, 9: -4.0})]
    for kwargs in settings:
        config = GenerationConfig.create(max_new_tokens=30, ignore_eos=True, **kwargs)
        want, _ = SpecDecoder(target, None).generate_ids(PROMPT, config)
        for name, drafter in _drafters(target_model, backend).items():
            for k in (1, 5):
                spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=k, adaptive=False))
                assert spec.generate_ids(PROMPT, config)[0] == want, (kwargs, name, k)


def test_batched_requests_keep_their_own_penalties(target_model):
    """Requests with different penalties share each pass; each equals the same request served alone."""
    target = loaded(target_model, "kernels")
    decoder = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3), SpeculationConfig(num_speculative_tokens=4))
    configs = [GenerationConfig.create(max_new_tokens=24, ignore_eos=True, **kw) for kw in
               (dict(), dict(repetition_penalty=1.6), dict(frequency_penalty=1.5), dict(logit_bias={3: 5.0}))]
    engine = decoder.batch_engine(max_batch=4)
    for i, config in enumerate(configs):
        engine.submit(i, PROMPT[i:], config)
    outputs = {}
    while len(engine):
        for event in engine.step():
            if event.finished:
                outputs[event.request_id] = event.state.generated
    for i, config in enumerate(configs):
        assert outputs[i] == SpecDecoder(target, None).generate_ids(PROMPT[i:], config)[0]
    assert len({tuple(v) for v in outputs.values()}) == len(configs)


def test_logit_bias_forces_and_bans_tokens(target_model):
    target = loaded(target_model, "kernels")
    decoder = SpecDecoder(target, NgramDrafter(min_n=1, max_n=3))
    forced, _ = decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=12, ignore_eos=True,
                                                                     logit_bias={17: 100.0}))
    assert forced == [17] * 12
    plain, _ = decoder.generate_ids(PROMPT, GenerationConfig(max_new_tokens=12, ignore_eos=True))
    banned = {t: -100.0 for t in set(plain)}
    got, _ = decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=12, ignore_eos=True, logit_bias=banned))
    assert not set(got) & set(plain)
    with pytest.raises(ConfigError, match="vocabulary"):
        decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=4, logit_bias={10_000: 1.0}))


def test_subset_penalties_equal_the_full_vocabulary_ones_on_their_columns():
    """A drafter's reduced vocabulary (columns) gets exactly the full penalties' values there, for every path."""
    from specdec.penalties import SubsetPenalties, inverse_index

    gen = torch.Generator().manual_seed(0)
    history = TokenHistory([1, 2, 3], vocab_size=30)
    history.extend([4, 4, 9, 25])
    columns = torch.tensor([0, 4, 9, 2, 17, 11, 25])  # token 5 is outside: its count must not matter
    cfg = SamplingConfig(repetition_penalty=1.7, frequency_penalty=0.4, presence_penalty=0.3,
                         logit_bias=((9, 2.0), (5, -3.0), (17, 1.5)))
    subset = SubsetPenalties(history, columns, inverse_index(columns, 30), cfg)
    paths = [[], [17], [17, 5, 11], [4, 4]]
    full = torch.randn(len(paths), 30, generator=gen) * 3
    tokens = torch.tensor([t for p in paths for t in p])
    ancestors = torch.zeros(len(paths), len(tokens), dtype=torch.bool)
    start = 0
    for row, path in enumerate(paths):
        ancestors[row, start:start + len(path)] = True
        start += len(path)
    counts, seen = history.rows(tokens, ancestors)
    want = penalize(full, counts, seen, cfg)[:, columns]
    torch.testing.assert_close(subset.apply(full[:, columns], paths), want)


@pytest.mark.parametrize("tree", [False, True])
def test_eagle_drafts_with_the_requests_penalties(target_model, tree):
    """An EAGLE head (a reduced draft vocabulary) drafting under penalties: output still the plain decoding's."""
    from specdec.drafters.heads.eagle import EagleDrafter
    from specdec.drafters.heads.eagle_head import new_head

    target = loaded(target_model, "kernels")
    torch.manual_seed(1)
    head = new_head(target_model, "tiny", torch.arange(40))
    decoder = SpecDecoder(target, EagleDrafter(head, tree=tree, width=3),
                          SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    for kwargs in (dict(repetition_penalty=1.5), dict(frequency_penalty=1.2, logit_bias={7: 3.0, 50: 2.0})):
        config = GenerationConfig.create(max_new_tokens=30, ignore_eos=True, **kwargs)
        got, metrics = decoder.generate_ids(PROMPT, config)
        assert got == SpecDecoder(target, None).generate_ids(PROMPT, config)[0]
        assert metrics.drafted_tokens > 0


@pytest.mark.parametrize("temperature, top_p", [(5e-324, 1.0), (1e-40, 1.0), (1.0, 5e-324)])
def test_a_tiny_temperature_or_top_p_samples_the_best_token(target_model, temperature, top_p):
    from specdec.sampling import probs_from_logits

    probs = probs_from_logits(torch.tensor([[3.0, 2.0, -1.0], [-5.0, -7.0, -6.0]]),
                              SamplingConfig(temperature=temperature, top_p=top_p))
    assert torch.equal(probs, torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    decoder = SpecDecoder(loaded(target_model), NgramDrafter())
    sampled, _ = decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=6, temperature=temperature,
                                                                      top_p=top_p, seed=1))
    greedy, _ = decoder.generate_ids(PROMPT, GenerationConfig.create(max_new_tokens=6))
    assert sampled == greedy
