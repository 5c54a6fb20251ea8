"""Greedy speculative decoding returns exactly the baseline's tokens (float32, tiny random models)."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.models.draft_model import DraftModelDrafter
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.drafters.lookup.suffix import SuffixDrafter
from specdec.drafters.lookup.recycle import RecycleDrafter
from specdec.engine import SpecDecoder
from tiny import loaded, tiny_llama


def _prompts(vocab: int, count: int = 10) -> list[list[int]]:
    gen = torch.Generator().manual_seed(123)
    prompts = []
    for i in range(count):
        n = 3 + 4 * i
        p = torch.randint(0, vocab - 1, (n,), generator=gen).tolist()
        if i % 2:  # repeated material, so that prompt lookup finds matches
            p = p + p[: n // 2] + p
        prompts.append(p)
    return prompts


BACKENDS = ["kernels", "torch", "hf"]


@pytest.fixture(scope="module")
def target_model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def random_draft_model():
    return tiny_llama(seed=7, hidden=32, heads=2, kv_heads=1)


def _drafter(kind: str, target_model, random_draft_model, backend: str):
    if kind == "ngram":
        return NgramDrafter(min_n=1, max_n=3)
    if kind == "suffix":  # one drafter for every prompt: it drafts from the earlier prompts' outputs too
        return SuffixDrafter(min_n=1)
    if kind == "recycle":  # one for every prompt too: its table keeps the target's choices of earlier prompts
        return RecycleDrafter(min_n=1)
    if kind == "self":
        return DraftModelDrafter(loaded(target_model, backend).backend, target_model.config.vocab_size)
    return DraftModelDrafter(loaded(random_draft_model, backend).backend, target_model.config.vocab_size)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", ["ngram", "suffix", "recycle", "self", "random"])
@pytest.mark.parametrize("k,adaptive", [(1, False), (3, False), (8, False), (8, True)])
def test_speculation_equals_baseline(target_model, random_draft_model, backend, kind, k, adaptive):
    target = loaded(target_model, backend)
    baseline = SpecDecoder(target, None)
    drafter = _drafter(kind, target_model, random_draft_model, backend)
    spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=k, adaptive=adaptive))
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    drafted = accepted = 0
    for prompt in _prompts(target_model.config.vocab_size):
        want, _ = baseline.generate_ids(prompt, config)
        got, metrics = spec.generate_ids(prompt, config)
        assert got == want, f"prompt {prompt}"
        drafted += metrics.drafted_tokens
        accepted += metrics.accepted_tokens
    if kind == "self" and not adaptive:
        assert drafted > 0 and accepted == drafted  # the target drafting for itself is always right
    if kind == "random" and not adaptive:
        assert drafted > 0 and accepted < 0.5 * drafted


@pytest.mark.parametrize("backend", BACKENDS)
def test_eos_inside_accepted_draft_ends_like_baseline(target_model, backend):
    target = loaded(target_model, backend)
    eos = target.info.eos_token_ids[0]
    # A prompt after which the model soon emits EOS: find one by search.
    baseline = SpecDecoder(target, None)
    spec = SpecDecoder(target, DraftModelDrafter(loaded(target_model, backend).backend, target_model.config.vocab_size),
                       SpeculationConfig(num_speculative_tokens=8, adaptive=False))
    config = GenerationConfig(max_new_tokens=60)
    stopped = 0
    for seed in range(40):
        prompt = torch.randint(0, eos, (6,), generator=torch.Generator().manual_seed(seed)).tolist()
        want, m0 = baseline.generate_ids(prompt, config)
        got, m1 = spec.generate_ids(prompt, config)
        assert got == want
        assert m1.finish_reason == m0.finish_reason
        if want[-1] == eos:
            stopped += 1
            assert m1.finish_reason == "stop"
    assert stopped > 0, "no prompt reached EOS; the test proves nothing"


def test_max_new_tokens_respected(target_model):
    target = loaded(target_model, "torch")
    spec = SpecDecoder(target, DraftModelDrafter(loaded(target_model).backend, target_model.config.vocab_size),
                       SpeculationConfig(num_speculative_tokens=8, adaptive=False))
    for n in (1, 2, 7, 9, 10):
        got, metrics = spec.generate_ids([1, 2, 3], GenerationConfig(max_new_tokens=n, ignore_eos=True))
        assert len(got) == n and metrics.new_tokens == n and metrics.finish_reason == "length"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_kernels_keep_greedy_equality_in_low_precision(dtype):
    """On the batch-invariant CPU kernels, speculation is exact in bfloat16 and float16 too."""
    target_model = tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2).to(dtype)
    draft_model = tiny_llama(seed=7, hidden=32, heads=2, kv_heads=1).to(dtype)
    target = loaded(target_model, "kernels", dtype=dtype)
    baseline = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=40, ignore_eos=True)
    drafters = [NgramDrafter(min_n=1, max_n=3),
                DraftModelDrafter(loaded(target_model, "kernels", dtype=dtype).backend, target_model.config.vocab_size),
                DraftModelDrafter(loaded(draft_model, "kernels", dtype=dtype).backend, target_model.config.vocab_size)]
    for drafter in drafters:
        spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=6, adaptive=False))
        for prompt in _prompts(target_model.config.vocab_size):
            assert spec.generate_ids(prompt, config)[0] == baseline.generate_ids(prompt, config)[0]
