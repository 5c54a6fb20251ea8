"""EAGLE-1/2 heads in their authors' layout (config.json + model.safetensors, SafeAILab/EAGLE's key names), written
here with random weights for a tiny target: no published head is downloaded."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from specdec.speculation_config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.heads.eagle_head import new_head
from specdec.drafters.heads.eagle_loading import load_head
from specdec.engine import SpecDecoder
from specdec.errors import IncompatibleDraftError, ModelLoadError
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama

THETA = 500000.0  # the head's own RoPE base, not the target's (10000)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2)


@pytest.fixture(scope="module")
def target(model):
    return loaded(model, "kernels")


def write_published(folder, hidden=64, heads=4, kv_heads=2, vocab=64, seed=5, **tensors):
    """A random EAGLE-1/2 head as its authors publish it: config.json (a LlamaConfig of one layer) and
    model.safetensors in float16 (fc, layer 0 without input_layernorm, a copy of the embedding); `tensors` adds
    or replaces tensors by name (None removes one). Returns the tensors as written."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    H, hd, inter = hidden, hidden // heads, 2 * hidden

    def rand(*shape, scale=0.1):
        return (torch.randn(*shape, generator=gen) * scale).half()

    weights = {"fc.weight": rand(H, 2 * H), "fc.bias": rand(H),
               "layers.0.self_attn.q_proj.weight": rand(heads * hd, H),
               "layers.0.self_attn.k_proj.weight": rand(kv_heads * hd, H),
               "layers.0.self_attn.v_proj.weight": rand(kv_heads * hd, H),
               "layers.0.self_attn.o_proj.weight": rand(H, heads * hd),
               "layers.0.mlp.gate_proj.weight": rand(inter, H), "layers.0.mlp.up_proj.weight": rand(inter, H),
               "layers.0.mlp.down_proj.weight": rand(H, inter),
               "layers.0.post_attention_layernorm.weight": 1 + rand(H), "embed_tokens.weight": rand(vocab, H)}
    weights.update(tensors)
    weights = {k: v for k, v in weights.items() if v is not None}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": H,
              "intermediate_size": inter, "max_position_embeddings": 2048, "num_attention_heads": heads,
              "num_hidden_layers": 1, "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-5,
              "rope_scaling": None, "rope_theta": THETA, "torch_dtype": "float16", "vocab_size": vocab}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return weights


def reference(w, embed, features, tokens, heads=4, kv_heads=2, eps=1e-5):
    """The published head written out from EAGLE's cnets: fc over cat(embedding of x_{t+1}, f_t), then a Llama
    decoder layer with no input norm (causal attention, RoPE at positions 0..T-1). features (T, H) -> (T, H)."""
    w = {k: v.float() for k, v in w.items()}
    x = torch.cat([embed[tokens], features], -1) @ w["fc.weight"].T + w["fc.bias"]
    T, H = x.shape
    hd = H // heads

    def project(name, n):  # (n heads, T, hd)
        return (x @ w[f"layers.0.self_attn.{name}_proj.weight"].T).view(T, n, hd).transpose(0, 1)

    angles = torch.arange(T).float()[:, None] / THETA ** (torch.arange(0, hd, 2).float() / hd)
    angles = torch.cat([angles, angles], -1)

    def rope(z):
        return z * angles.cos() + torch.cat([-z[..., hd // 2:], z[..., :hd // 2]], -1) * angles.sin()

    q, k = rope(project("q", heads)), rope(project("k", kv_heads)).repeat_interleave(heads // kv_heads, 0)
    v = project("v", kv_heads).repeat_interleave(heads // kv_heads, 0)
    scores = (q @ k.transpose(1, 2) / math.sqrt(hd)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    x = x + (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, H) @ w["layers.0.self_attn.o_proj.weight"].T
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w["layers.0.post_attention_layernorm.weight"]
    mlp = F.silu(h @ w["layers.0.mlp.gate_proj.weight"].T) * (h @ w["layers.0.mlp.up_proj.weight"].T)
    return x + mlp @ w["layers.0.mlp.down_proj.weight"].T


def products(head, kind):
    from specdec.drafters.heads.eagle_kernels import KernelEagleHead, kernel_head_problem

    if kind == "torch":
        return head
    if problem := kernel_head_problem(head.config):
        pytest.skip(f"the CPU kernels cannot run here: {problem}")
    return KernelEagleHead(head)


@pytest.mark.parametrize("kind", ["torch", "kernels"])
def test_a_published_head_computes_the_published_formula(model, target, tmp_path, kind):
    """Whole sequence, then the same pairs split into a prefix and a continuation over its keys: the reference's
    hidden states; and the logits are the target's LM head over the whole vocabulary."""
    weights = write_published(tmp_path)
    loaded_head = load_head(tmp_path, target)
    assert not loaded_head.config.input_norm and loaded_head.draft_ids.tolist() == list(range(64))
    head = products(loaded_head, kind)
    torch.manual_seed(6)
    features, tokens = torch.randn(10, 64), torch.randint(0, 64, (10,))
    embed = model.get_input_embeddings().weight.detach()
    want = reference(weights, embed, features, tokens)
    with torch.no_grad():
        got, _ = head(features[None], tokens[None], torch.arange(10)[None])
        first, kv = head(features[None, :6], tokens[None, :6], torch.arange(6)[None])
        rest, _ = head(features[None, 6:], tokens[None, 6:], torch.arange(6, 10)[None], past=kv)
        logits = head.draft_logits(got[0])
    torch.testing.assert_close(got[0], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat([first, rest], 1)[0], want, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(logits, want @ model.get_output_embeddings().weight.detach().T, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree", [False, True])
def test_a_published_head_keeps_greedy_output(target, tmp_path, tree):
    """Through the --eagle-head path (create_drafter), float32: speculative output is plain greedy output."""
    write_published(tmp_path)
    drafter = create_drafter("eagle", target, eagle_head=tmp_path, tree=tree)
    assert drafter.head.draft_ids.numel() == 64
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
    assert drafted_keeping_greedy_output(decoder, target) > 0


def test_a_pickled_head_is_refused_with_the_conversion_that_works(target, tmp_path):
    """A folder holding only pytorch_model.bin is refused; the command the message gives makes it loadable."""
    import shutil
    import subprocess
    import sys

    from specdec.drafters.heads.eagle_published import CONVERT

    weights = write_published(tmp_path / "safetensors")
    folder = tmp_path / "pickle"
    folder.mkdir()
    torch.save(weights, folder / "pytorch_model.bin")  # as the authors publish it
    with pytest.raises(ModelLoadError, match=r"pickle \(pytorch_model.bin\).*save_file.*weights_only=True"):
        load_head(folder, target)
    shutil.copy(tmp_path / "safetensors" / "config.json", folder)
    assert CONVERT.startswith("python -c ")
    subprocess.run([sys.executable, "-c", CONVERT[len("python -c "):].strip('"')], cwd=folder, check=True)
    converted, direct = load_head(folder, target), load_head(tmp_path / "safetensors", target)
    assert all(torch.equal(a, b) for a, b in zip(converted.state_dict().values(), direct.state_dict().values()))


@pytest.mark.parametrize("sizes, message", [({"hidden": 32}, "hidden size 32, but 'tiny' has 64"),
                                            ({"vocab": 80}, "vocabulary size 80, but 'tiny' has 64"),
                                            ({"heads": 8, "kv_heads": 4}, "attention heads 8, but 'tiny' has 4")])
def test_a_head_for_other_sizes_is_refused(target, tmp_path, sizes, message):
    write_published(tmp_path, **sizes)
    with pytest.raises(IncompatibleDraftError, match=message):
        load_head(tmp_path, target)


def test_tensors_outside_the_layout_are_refused(target, tmp_path):
    write_published(tmp_path, **{"layers.0.input_layernorm.weight": torch.ones(64).half()})
    with pytest.raises(ModelLoadError, match="unexpected tensors layers.0.input_layernorm.weight"):
        load_head(tmp_path, target)


def test_rope_follows_the_heads_config(tmp_path):
    from specdec.drafters.heads.eagle_published import rope_frequencies

    base = 1.0 / 10000.0 ** (torch.arange(0, 16, 2).float() / 16)
    assert torch.equal(rope_frequencies({}, 16, tmp_path), base)
    linear = {"rope_parameters": {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}}  # transformers 5
    assert torch.equal(rope_frequencies(linear, 16, tmp_path), base / 4)
    with pytest.raises(ModelLoadError, match="RoPE scaling 'yarn'"):
        rope_frequencies({"rope_scaling": {"type": "yarn", "factor": 4.0}}, 16, tmp_path)
    # Llama 3.1's (the published EAGLE-3 heads' config): short wavelengths kept, long ones divided by the factor
    llama3 = {"rope_theta": 500000.0, "num_attention_heads": 4, "max_position_embeddings": 131072,
              "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                               "original_max_position_embeddings": 8192, "rope_type": "llama3"}}
    base = 1.0 / 500000.0 ** (torch.arange(0, 128, 2).float() / 128)
    scaled = rope_frequencies(llama3, 128, tmp_path)
    wavelength = 2 * math.pi / base
    short, long = wavelength < 8192 / 4, wavelength > 8192 / 1
    assert short.any() and long.any() and not (short & long).any()
    torch.testing.assert_close(scaled[short], base[short])
    torch.testing.assert_close(scaled[long], base[long] / 8)
    middle = ~short & ~long
    assert ((scaled[middle] < base[middle]) & (scaled[middle] > base[middle] / 8)).all()


def test_specdec_heads_without_the_input_norm_field_still_load(model, target, tmp_path):
    """eagle_config.json files written before the input_norm field load as before, with the norm."""
    torch.manual_seed(7)
    head = new_head(model, "tiny", torch.arange(40))
    head.save(tmp_path, dtype=torch.float32)
    config = json.loads((tmp_path / "eagle_config.json").read_text())
    del config["input_norm"]
    (tmp_path / "eagle_config.json").write_text(json.dumps(config))
    again = load_head(tmp_path, target)
    assert again.config.input_norm and again.draft_ids.tolist() == list(range(40))
    features, tokens = torch.randn(1, 5, 64), torch.randint(0, 64, (1, 5))
    with torch.no_grad():
        torch.testing.assert_close(again(features, tokens, torch.arange(5)[None])[0],
                                   head(features, tokens, torch.arange(5)[None])[0])


def test_training_can_start_from_a_published_head(target, tmp_path):
    """train-drafter --init-from DIR: a fresh head without the input norm takes a published head's weights."""
    write_published(tmp_path / "head")
    start = load_head(tmp_path / "head", target)
    head = new_head(target.hf_model, "tiny", torch.arange(16), input_norm=start.config.input_norm)
    head.load_state_dict(start.state_dict())
    assert not head.config.input_norm and torch.equal(head.fc.weight, start.fc.weight)
