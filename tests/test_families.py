"""Model families beyond Llama on the fast paths (Qwen3, sliding-window Mistral, Qwen2 and Qwen3): float32 greedy
output is transformers' own `generate`, on the CPU kernels and the torch forward; bfloat16 speculation on the
kernels is plain decoding; a model they cannot run falls back to transformers' forward with one line saying why."""
import pytest
import torch

from families import VARIANTS, family_model, prompt_ids
from specdec.config import GenerationConfig
from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.heads.eagle import EagleDrafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.lookup.ngram import NgramDrafter
from specdec.engine import SpecDecoder
from specdec.models.family import family_of
from tiny import loaded

NEW_TOKENS = 32
WINDOWED = [v for v in VARIANTS if v.endswith("-window")]


def _generate(hf_model, prompt: list[int]) -> list[int]:
    out = hf_model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS,
                            do_sample=False)
    return out[0, len(prompt):].tolist()


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request):
    return request.param, family_model(request.param)


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_float32_greedy_output_is_transformers_generate(variant, backend):
    name, model = variant
    target = loaded(model, backend)
    assert type(target.backend).__name__ == {"kernels": "KernelLlama", "torch": "FastLlama"}[backend]
    decoder = SpecDecoder(target, None)
    for prompt in prompt_ids():
        got, _ = decoder.generate_ids(prompt, GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True))
        assert got == _generate(model, prompt), (name, prompt)


@pytest.mark.parametrize("name", WINDOWED)
def test_the_windows_reach_past_their_length_and_change_the_output(name):
    """Each windowed variant's prompts and outputs run well past its window, and the same weights without a window
    give other tokens: the tests above would fail if the window were ignored."""
    model = family_model(name)
    window = max(family_of(model.config).windows)
    assert 8 <= window <= 16 and all(len(p) + NEW_TOKENS >= window + 20 for p in prompt_ids())
    unwindowed = family_model(name, windows=False)
    unwindowed.load_state_dict(model.state_dict())
    assert not any(family_of(unwindowed.config).windows)
    assert any(_generate(model, p) != _generate(unwindowed, p) for p in prompt_ids())


@pytest.mark.parametrize("drafter", ["quantized", "ngram", "eagle"])
@pytest.mark.parametrize("name", list(VARIANTS))
def test_bfloat16_speculation_on_the_kernels_is_plain_decoding(name, drafter):
    model = family_model(name, dtype=torch.bfloat16)
    target = loaded(model, "kernels", dtype=torch.bfloat16)
    if drafter == "quantized":
        made = create_drafter("quantized", target)
    elif drafter == "ngram":
        made = NgramDrafter(min_n=1, max_n=3)
    else:  # an untrained head drafts poorly, in chains and trees over the windowed keys
        torch.manual_seed(1)
        made = EagleDrafter(new_head(model, "tiny", torch.arange(model.config.vocab_size)).to(torch.bfloat16),
                            tree=True, width=3)
    spec = SpecDecoder(target, made, SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    plain = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    drafted = 0
    for prompt in prompt_ids():
        repeated = prompt + prompt  # material prompt lookup finds
        got, metrics = spec.generate_ids(repeated, config)
        assert got == plain.generate_ids(repeated, config)[0], (name, drafter, repeated)
        drafted += metrics.drafted_tokens
    assert drafted > 0


def _tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=512, n_embd=32, n_layer=2, n_head=2, n_positions=128,
                                      eos_token_id=2, bos_token_id=None)).eval()


def _llama_with(**change):
    from tiny import tiny_llama

    model = tiny_llama(seed=0, vocab=512, hidden=32)
    for key, value in change.items():
        setattr(model.config, key, value)
    return model


@pytest.mark.parametrize("make,missing", [
    (_tiny_gpt2, "model type 'gpt2'"),
    (lambda: _llama_with(hidden_act="gelu_pytorch_tanh"), "the activation 'gelu_pytorch_tanh'"),
    (lambda: _llama_with(mlp_bias=True), "MLP biases"),
    (lambda: _llama_with(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}),
     "RoPE type 'dynamic'"),
])
def test_a_model_the_fast_paths_cannot_run_falls_back_to_transformers_with_one_line_naming_why(capsys, make,
                                                                                               missing):
    model = make()
    target = loaded(model, "auto")
    lines = capsys.readouterr().err.splitlines()
    assert type(target.backend).__name__ == "HFBackend"
    assert len(lines) == 1 and lines[0].startswith("specdec: ") and missing in lines[0], lines
    assert "hf backend" in lines[0]
    prompt = prompt_ids()[0]
    got, _ = SpecDecoder(target, None).generate_ids(prompt, GenerationConfig(max_new_tokens=8, ignore_eos=True))
    want = model.generate(torch.tensor([prompt]), max_new_tokens=8, min_new_tokens=8, do_sample=False)
    assert got == want[0, len(prompt):].tolist()


def test_the_supported_families_print_nothing(capsys):
    loaded(family_model("qwen3"), "torch")
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("backend", ["kernels", "torch"])
def test_longrope_models_run_on_the_fast_paths_up_to_where_their_short_factors_hold(backend):
    """Past original_max_position_embeddings transformers' LongRoPE turns to its long factors for a whole pass (the
    keys cached before keep the short ones): the fast paths' static tables stop there."""
    model = family_model("phi3-longrope-window")
    target = loaded(model, backend)
    assert target.info.max_context == family_of(model.config).context_limit == 96 < model.config.max_position_embeddings


@pytest.mark.parametrize("name", ["qwen3-window", "phi3-longrope-window", "gemma2", "gemma3"])
def test_float32_speculation_on_the_torch_forward_is_plain_decoding_alone_and_in_a_batch(name):
    """Tree verify passes (their masks under the windows), and several requests in one pass from scattered slots."""
    model = family_model(name)
    target = loaded(model, "torch", slots=2)
    torch.manual_seed(1)
    head = new_head(model, "tiny", torch.arange(model.config.vocab_size))
    spec = SpecDecoder(target, EagleDrafter(head, tree=True, width=3),
                       SpeculationConfig(num_speculative_tokens=4, adaptive=False))
    plain = SpecDecoder(target, None)
    config = GenerationConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True)
    prompts = [p + p for p in prompt_ids()]
    want = [plain.generate_ids(p, config)[0] for p in prompts]
    assert [spec.generate_ids(p, config)[0] for p in prompts] == want
    assert [r.token_ids for r in spec.generate_many(prompts, config)] == want
