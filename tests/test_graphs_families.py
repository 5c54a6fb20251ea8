"""The shape-static (CUDA-graph) pass runs every family the torch forward runs: q/k norms, sliding windows (the
key mask built on the device), partial RoPE and per-layer RoPE tables, Gemma's norms, soft caps and embedding
scale. Uncaptured on the CPU, its greedy output is transformers' own, for plain decoding, EAGLE trees and a batch."""
import pytest
import torch

from families import VARIANTS, family_model, prompt_ids
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.engine import SpecDecoder
from tiny import loaded

NEW_TOKENS = 32


def _count_static_passes(target) -> list:
    """A list that gets one entry per pass the target's static path runs (None where it declined the pass)."""
    runner, passes = target.backend.pass_graphs, []
    run = runner.run
    runner.run = lambda *args: passes.append(run(*args)) or passes[-1]
    return passes


@pytest.mark.parametrize("name", list(VARIANTS))
def test_graph_path_greedy_output_is_transformers_generate_for_every_family(name):
    model = family_model(name)
    target = loaded(model, "torch", graphs="on", slots=3)
    plain = SpecDecoder(target, None)
    torch.manual_seed(1)
    head = new_head(model, "tiny", torch.arange(model.config.vocab_size))
    spec = SpecDecoder(target, EagleDrafter(head, tree=True, width=3),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [p + p for p in prompt_ids()]  # with the outputs, past every variant's window
    static = _count_static_passes(target)
    for prompt in prompts:
        want = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(prompt):]
        want = want.tolist()
        assert plain.generate_ids(prompt, config)[0] == want, (name, "plain")
        assert spec.generate_ids(prompt, config)[0] == want, (name, "eagle tree")
    assert [r.token_ids for r in spec.generate_many(prompts, config)] == \
        [plain.generate_ids(p, config)[0] for p in prompts], (name, "batch")
    assert sum(out is not None for out in static) >= 2 * NEW_TOKENS  # decode and verify passes took the static path
