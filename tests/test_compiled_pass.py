"""The shape-static pass compiled by torch.compile (models/compiled_pass.py), uncaptured on the CPU: the same logits
as the plain pass, greedy output equal to plain decoding, and each bucket and window compiled once. One tiny model
and two buckets keep the compile time small (inductor compiles C++ on the CPU); skipped where it cannot compile."""
import pytest
import torch
from torch._dynamo.utils import counters

from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.models.compiled_pass import compiled_steps, inductor_problem
from specdec.models.pass_graphs import PassGraphs, padded_inputs
from specdec.models import static_pass as static_pass_module
from specdec.models.static_pass import static_pass
from specdec.verify import tree_mask
from tiny import loaded, tiny_llama

pytestmark = pytest.mark.skipif(inductor_problem() is not None, reason=str(inductor_problem()))

# float32 logits of magnitude ~7; inductor's fused reductions (RMSNorm's mean) sum in another order than eager's
CLOSE = {"rtol": 1e-5, "atol": 2e-5}
SHAPE = (1, 8)  # the one bucket the logits test compiles; generation adds (1, 1)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


def _entries() -> dict[str, int]:
    """Dynamo's cache entries (compiled graphs) of each step, and all graphs compiled so far."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    steps = {name: getattr(static_pass_module, name) for name in ("prologue", "layer_in", "layer_out", "epilogue")}
    entries = {name: len(_debug_get_cache_entry_list(step.__code__)) for name, step in steps.items()}
    return {**entries, "graphs": counters["stats"]["unique_graphs"]}


def _prefilled(model, length: int):
    backend = loaded(model, "torch", graphs="on").backend
    cache = backend.new_cache()
    backend.forward(cache, torch.randint(0, 63, (length,), generator=torch.Generator().manual_seed(5)),
                    last_only=True)
    return backend, cache


@pytest.mark.parametrize("tree", [False, True])
def test_the_compiled_pass_gives_the_plain_pass_logits_and_compiles_each_bucket_and_window_once(model, tree):
    backend, cache = _prefilled(model, 17)
    mask = tree_mask([-1, -1, 0, 2, 1]) if tree else None
    ids = torch.randint(0, 63, (6,), generator=torch.Generator().manual_seed(6))
    inputs = padded_inputs(SHAPE, [cache], [ids], mask, backend.pool.capacity - 1)
    window = backend.pass_graphs.windows[0]
    plain = static_pass(backend, inputs, window, (1,))
    compiled = static_pass(backend, inputs, window, (1,), compiled_steps())
    for got, want in zip(compiled, plain):  # logits (B, T, V), hidden with layer 1's input (B, T, 2H)
        torch.testing.assert_close(got[0, :6], want[0, :6], **CLOSE)
    assert torch.equal(compiled[0][0, :6].argmax(-1), plain[0][0, :6].argmax(-1))

    compiled_once = _entries()
    again = static_pass(backend, padded_inputs(SHAPE, [cache], [ids.flip(0)], mask, backend.pool.capacity - 1),
                        window, (1,), compiled_steps())  # the next step's values, the same bucket and window
    assert _entries() == compiled_once
    assert not torch.equal(again[0], compiled[0])  # it did run on the new inputs
    for _ in range(2):  # a longer key window compiles the prologue alone (once), not the layers
        static_pass(backend, inputs, backend.pass_graphs.windows[1], (1,), compiled_steps())
    longer = _entries()
    layers = ("layer_in", "layer_out", "epilogue")
    assert [longer[k] for k in layers] == [compiled_once[k] for k in layers]
    assert compiled_once["prologue"] <= longer["prologue"] <= compiled_once["prologue"] + 1
    assert longer["prologue"] >= 2 and longer["layer_in"] >= 1


def test_greedy_decoding_and_speculation_through_the_compiled_pass_equal_plain_decoding(model):
    target = loaded(model, "torch", graphs="on")
    backend = target.backend
    backend.pass_graphs = PassGraphs(backend, capture=False, compile=True, batch_sizes=(1,), token_counts=(1, 8))
    ran = []
    run = backend.pass_graphs.run
    backend.pass_graphs.run = lambda *args: ran.append(run(*args)) or ran[-1]
    plain = SpecDecoder(loaded(model, "torch", graphs="off"), None)
    config = GenerationConfig(max_new_tokens=24, ignore_eos=True)
    gen = torch.Generator().manual_seed(11)
    p = torch.randint(0, 63, (9,), generator=gen).tolist()
    prompts = [torch.randint(0, 63, (5,), generator=gen).tolist(), p + p[:4] + p]  # the second repeats itself
    decoders = [SpecDecoder(target, None),
                SpecDecoder(target, NgramDrafter(min_n=1, max_n=3), SpeculationConfig(num_speculative_tokens=5,
                                                                                     adaptive=False))]
    drafted = 0
    for decoder in decoders:
        for prompt in prompts:
            got, metrics = decoder.generate_ids(prompt, config)
            assert got == plain.generate_ids(prompt, config)[0], prompt
            drafted += metrics.drafted_tokens
    assert drafted > 0 and sum(out is not None for out in ran) >= 2 * 23  # the compiled passes ran


def test_compile_choices_that_cannot_apply_are_refused(model):
    from specdec.errors import ConfigError

    with pytest.raises(ConfigError, match="needs --graphs on"):
        loaded(model, "torch", graphs="off", compile="on")
    with pytest.raises(ConfigError, match="compile must be one of"):
        loaded(model, "torch", graphs="on", compile="sometimes")
    assert not loaded(model, "torch", graphs="on", compile="auto").backend.pass_graphs.compiled  # auto: off until measured
    assert loaded(model, "torch", graphs="on", compile="on").backend.pass_graphs.compiled
