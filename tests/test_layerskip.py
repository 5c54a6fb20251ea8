"""Layer-skip self-speculation: an early exit of the target drafts; output stays the target's."""
import pytest
import torch

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError
from tiny import loaded, tiny_llama


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=4, hidden=64, heads=4, kv_heads=2, layers=4)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
@pytest.mark.parametrize("layers", [1, 3])
def test_layerskip_keeps_greedy_output(model, backend, layers):
    target = loaded(model, backend)
    drafter = create_drafter("layerskip", target, layerskip_layers=layers)
    assert drafter.name == "layerskip" and drafter.fork().name == "layerskip"
    spec = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    base = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    for prompt in ([1, 2, 3], list(range(5, 30)), [9] * 12):
        got, metrics = spec.generate_ids(prompt, config)
        assert got == base.generate_ids(prompt, config)[0]
        assert metrics.drafted_tokens > 0


def test_early_exit_equals_running_fewer_layers(model):
    """The kernels' early exit is the same computation as a model truncated to those layers."""
    import copy

    short = copy.deepcopy(model)
    short.model.layers = short.model.layers[:2]
    short.config.num_hidden_layers = 2
    full, cut = loaded(model, "kernels").backend, loaded(short, "kernels").backend
    ids = torch.arange(3, 20)
    a = full.forward(full.new_cache(), ids, layers=2).logits
    b = cut.forward(cut.new_cache(), ids).logits
    assert torch.equal(a, b)


def test_layerskip_refuses_bad_settings(model):
    with pytest.raises(ConfigError, match="layers <"):
        create_drafter("layerskip", loaded(model, "kernels"), layerskip_layers=4)
    with pytest.raises(ConfigError, match="kernels or torch backend"):
        create_drafter("layerskip", loaded(model, "hf"))
