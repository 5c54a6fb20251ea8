"""The CUDA path: on a GPU, speculative greedy output is plain decoding's and transformers' own, token for token.

Skipped where torch sees no CUDA GPU (CI has none). On a GPU machine:
    python -m pytest -n 0 tests/test_cuda.py           # tiny random models
    python -m pytest -n 0 -m slow tests/test_cuda.py   # also the real default model (fetched once)
SPECDEC_TEST_DEVICE=cpu runs the same tests on the CPU's torch backend, to check the tests themselves.
"""
import json
import os
from pathlib import Path

import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder

DEVICE = os.environ.get("SPECDEC_TEST_DEVICE", "cuda")
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")

# Drafters that build by name for any model; eagle and medusa need heads (the real model ships them).
BY_NAME = ["ngram", "suffix", "lookahead", "draft-model", "layerskip"]
PROMPTS = ["the cat sat on the mat and the dog ran to see the big red house",
           "a small blue star is over the sky then the moon is up again and the sun is down",
           "we ran up the tree and she was in the house with the green dog"]


def _hf_greedy(target, prompt_ids: list[int], new_tokens: int) -> list[int]:
    """transformers' own greedy generate on the target's weights and device (it stops at an end-of-sequence
    token, where a request with ignore_eos goes on)."""
    ids = torch.tensor([prompt_ids], device=target.info.device)
    out = target.hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                                   do_sample=False, pad_token_id=0)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def tiny_target(tiny_folder):
    from specdec.models.loading import load_model

    target = load_model(str(tiny_folder), device=DEVICE, dtype="float32")
    assert target.info.device.type == DEVICE
    return target


@pytest.mark.parametrize("name", BY_NAME)
def test_tiny_speculation_equals_plain_and_transformers(tiny_target, tiny_draft_folder, name):
    options = {"draft_model": str(tiny_draft_folder)} if name == "draft-model" else {}
    drafter = create_drafter(name, tiny_target, **options)
    spec = SpecDecoder(tiny_target, drafter, SpeculationConfig(num_speculative_tokens=6, adaptive=False), chat=False)
    plain = SpecDecoder(tiny_target, None, chat=False)
    config = GenerationConfig(max_new_tokens=30, ignore_eos=True)
    drafted = 0
    for text in PROMPTS:
        ids = spec.encode(text)
        got, metrics = spec.generate_ids(ids, config)
        want, _ = plain.generate_ids(ids, config)
        reference = _hf_greedy(tiny_target, ids, 30)
        assert got == want and got[:len(reference)] == reference, text
        drafted += metrics.drafted_tokens
    assert drafted > 0


def test_tiny_batch_equals_one_at_a_time(tiny_target):
    spec = SpecDecoder(tiny_target, create_drafter("ngram", tiny_target),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False), chat=False)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    batched = spec.generate_many(PROMPTS, config, max_batch=3)
    for text, result in zip(PROMPTS, batched):
        assert result.token_ids == spec.generate_ids(spec.encode(text), config)[0], text


def test_tiny_seeded_sampling_repeats(tiny_target):
    spec = SpecDecoder(tiny_target, create_drafter("ngram", tiny_target),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False, sampling_verifier="coupled"),
                       chat=False)
    config = GenerationConfig.create(max_new_tokens=24, temperature=0.9, seed=5, ignore_eos=True)
    first = spec.generate(PROMPTS[0], config).token_ids
    assert first == spec.generate(PROMPTS[0], config).token_ids
    assert len(first) == 24


# ---- the real default model (SmolLM2-135M-Instruct) -------------------------------------------------------
GOLDEN = json.loads((Path(__file__).parent / "golden" / "smollm2-135m.json").read_text())
REAL_DRAFTERS = BY_NAME + ["eagle", "eagle-chain", "medusa", "select"]


@pytest.fixture(scope="module")
def real_target():
    from specdec.models.loading import load_model

    return load_model(GOLDEN["model"], device=DEVICE, dtype="float32")


@pytest.mark.slow
@pytest.mark.parametrize("drafter", REAL_DRAFTERS)
def test_real_model_speculation_equals_transformers(real_target, drafter):
    kind = drafter.removesuffix("-chain")
    made = create_drafter(kind, real_target, draft_model=real_target if kind == "draft-model" else None,
                          tree=not drafter.endswith("-chain"))
    spec = SpecDecoder(real_target, made, SpeculationConfig(num_speculative_tokens=6, adaptive=False))
    new = GOLDEN["max_new_tokens"]
    result = spec.generate(GOLDEN["prompt"], GenerationConfig(max_new_tokens=new))
    ids = spec.encode(GOLDEN["prompt"])
    assert result.token_ids == _hf_greedy(real_target, ids, len(result.token_ids))
    assert result.metrics.drafted_tokens > 0
    if kind in ("draft-model", "eagle", "medusa"):  # the target itself, or the heads shipped for it
        assert result.metrics.accepted_tokens > 0


@pytest.mark.slow
def test_real_model_plain_decoding_gives_the_golden_text(real_target):
    """float32 on a GPU gives the text recorded on a CPU (a near-tie could flip it; none does on this prompt)."""
    result = SpecDecoder(real_target, None).generate(GOLDEN["prompt"],
                                                     GenerationConfig(max_new_tokens=GOLDEN["max_new_tokens"]))
    assert result.token_ids == GOLDEN["token_ids"]
