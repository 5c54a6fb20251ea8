"""EAGLE-3 heads: the target's layer inputs, the head's formula in its authors' file layout (written here with random
weights: no published head is downloaded), lossless drafting with it, and training one."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from specdec.config import SpeculationConfig
from specdec.drafters import create_drafter
from specdec.drafters.base import feature_columns
from specdec.drafters.eagle3_head import default_feature_layers, load_eagle3_head, new_eagle3_head
from specdec.engine import SpecDecoder
from specdec.errors import ConfigError, IncompatibleDraftError, ModelLoadError
from specdec.models.backend import check_feature_layers
from tiny import drafted_keeping_greedy_output, loaded, tiny_llama

LAYERS = (2, 4, 5)  # of the tiny target's 8
THETA = 500000.0  # the head's own RoPE base, not the target's (10000)


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=0, hidden=64, heads=4, kv_heads=2, layers=8)


def test_default_feature_layers():
    assert default_feature_layers(32) == (2, 16, 29)  # Llama-3.1-8B: the authors' choice
    assert default_feature_layers(30) == (2, 15, 27)  # smollm2-135m
    assert default_feature_layers(2) == (0, 1)  # small targets: within range, distinct


@pytest.mark.parametrize("backend", ["kernels", "torch", "hf"])
def test_the_target_returns_the_inputs_of_its_feature_layers(model, backend):
    """After the final hidden state come the inputs of the asked layers (transformers' hidden_states[i]), in the
    order asked with each pass, in a prefill and a later batched pass alike; columns find each layer; a layer
    outside the model is refused."""
    target = loaded(model, backend)
    ids = torch.tensor([1, 5, 9, 13, 2, 7])
    with torch.no_grad():
        states = model(ids[None], output_hidden_states=True).hidden_states
    asked = (5, 2, 4)
    cache = target.backend.new_cache()
    first = target.backend.forward(cache, ids[:4], output_hidden=True, feature_layers=asked).hidden
    later = target.backend.forward_batch([cache], [ids[4:]], output_hidden=True, feature_layers=asked)[0].hidden
    hidden = torch.cat([first, later]).float()
    H = model.config.hidden_size
    assert hidden.shape == (6, 4 * H)
    torch.testing.assert_close(hidden[:, :H], states[-1][0], atol=2e-4, rtol=1e-4)
    columns = feature_columns(asked, LAYERS, H)
    torch.testing.assert_close(hidden[:, columns], torch.cat([states[i][0] for i in (-1, *LAYERS)], -1), atol=2e-4,
                               rtol=1e-4)
    with pytest.raises(ConfigError, match="outside"):
        check_feature_layers((8,), target.info.num_layers)


def write_eagle3(folder, model, draft_vocab=40, seed=5, layers=LAYERS, **tensors):
    """A random EAGLE-3 head as its authors publish it: config.json and model.safetensors in float16 (fc over three
    layers, midlayer, norm, a draft LM head, d2t and t2d, a copy of the embedding); `tensors` adds or replaces
    tensors by name (None removes one). Returns (the tensors as written, the draft vocabulary's token ids)."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    H, nh, nkv, V = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.vocab_size
    hd, inter = H // nh, 96

    def rand(*shape, scale=0.1):
        return (torch.randn(*shape, generator=gen) * scale).half()

    draft_ids = torch.randperm(V, generator=gen)[:draft_vocab].sort().values
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[draft_ids] = True
    weights = {"fc.weight": rand(H, 3 * H), "midlayer.hidden_norm.weight": 1 + rand(H),
               "midlayer.input_layernorm.weight": 1 + rand(H),
               "midlayer.self_attn.q_proj.weight": rand(nh * hd, 2 * H),
               "midlayer.self_attn.k_proj.weight": rand(nkv * hd, 2 * H),
               "midlayer.self_attn.v_proj.weight": rand(nkv * hd, 2 * H),
               "midlayer.self_attn.o_proj.weight": rand(H, nh * hd),
               "midlayer.mlp.gate_proj.weight": rand(inter, H), "midlayer.mlp.up_proj.weight": rand(inter, H),
               "midlayer.mlp.down_proj.weight": rand(H, inter),
               "midlayer.post_attention_layernorm.weight": 1 + rand(H), "norm.weight": 1 + rand(H),
               "lm_head.weight": rand(draft_vocab, H, scale=0.5), "d2t": draft_ids - torch.arange(draft_vocab),
               "t2d": t2d, "embed_tokens.weight": rand(V, H)}
    weights.update(tensors)
    weights = {k: v for k, v in weights.items() if v is not None}
    config = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_act": "silu",
              "hidden_size": H, "intermediate_size": inter, "max_position_embeddings": 2048,
              "num_attention_heads": nh, "num_hidden_layers": 1, "num_key_value_heads": nkv, "rms_norm_eps": 1e-5,
              "rope_scaling": None, "rope_theta": THETA, "torch_dtype": "float16", "vocab_size": V,
              "draft_vocab_size": draft_vocab}
    if layers is not None:  # SpecForge's and SGLang's convention: the outputs of the layers before those read
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers]}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, str(folder / "model.safetensors"))
    return weights, draft_ids


def reference_logits(w: dict, embed: torch.Tensor, layer_inputs: torch.Tensor, tokens: torch.Tensor, heads: int,
                     kv_heads: int) -> torch.Tensor:
    """The EAGLE-3 draft step written out (the authors' cnets.py: fc, then one decoder layer whose attention reads
    [input_layernorm(embedding); hidden_norm(state)], then norm and lm_head) for one sequence of T true pairs:
    layer_inputs (T, 3H), tokens (T,) -> logits (T, K)."""
    w = {k: v.float() for k, v in w.items()}

    def norm(x, weight):
        return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)

    T = tokens.numel()
    g = layer_inputs @ w["fc.weight"].T
    a = torch.cat([norm(embed[tokens], w["midlayer.input_layernorm.weight"]),
                   norm(g, w["midlayer.hidden_norm.weight"])], -1)
    p = "midlayer.self_attn."
    q = (a @ w[p + "q_proj.weight"].T).view(T, heads, -1)
    k = (a @ w[p + "k_proj.weight"].T).view(T, kv_heads, -1)
    v = (a @ w[p + "v_proj.weight"].T).view(T, kv_heads, -1)
    hd = q.shape[-1]
    inv = 1.0 / THETA ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(T).float()[:, None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos()[:, None], torch.cat([ang, ang], -1).sin()[:, None]

    def rope(x):
        return x * cos + torch.cat([-x[..., hd // 2:], x[..., : hd // 2]], -1) * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
    scores = torch.einsum("thd,shd->hts", q, k) / math.sqrt(hd)
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    attn = torch.einsum("hts,shd->thd", scores.softmax(-1), v).reshape(T, -1)
    x = g + attn @ w[p + "o_proj.weight"].T
    h = norm(x, w["midlayer.post_attention_layernorm.weight"])
    m = "midlayer.mlp."
    x = x + (F.silu(h @ w[m + "gate_proj.weight"].T) * (h @ w[m + "up_proj.weight"].T)) @ w[m + "down_proj.weight"].T
    return norm(x, w["norm.weight"]) @ w["lm_head.weight"].T


@pytest.mark.parametrize("products", ["torch", "kernels"])
def test_a_published_head_computes_the_published_formula(model, tmp_path, products):
    target = loaded(model, "kernels")
    weights, draft_ids = write_eagle3(tmp_path / "head", model)
    head = load_eagle3_head(tmp_path / "head", target)
    assert head.feature_layers == LAYERS and torch.equal(head.draft_ids, draft_ids)
    if products == "kernels":
        from specdec.drafters.eagle_kernels import KernelEagle3Head, kernel_head_problem

        if kernel_head_problem(head.config):
            pytest.skip(f"the CPU kernels cannot run here: {kernel_head_problem(head.config)}")
        head = KernelEagle3Head(head)
    ids = torch.tensor([3, 9, 14, 2, 30, 7, 11])
    with torch.no_grad():
        states = model(ids[None], output_hidden_states=True).hidden_states
    layer_inputs = torch.cat([states[i][0] for i in LAYERS], -1)
    tokens = torch.tensor([9, 14, 2, 30, 7, 11, 5])  # x_{t+1} of each pair
    with torch.no_grad():
        out, _ = head(head.fuse(layer_inputs)[None], tokens[None], torch.arange(7)[None])
        logits = head.draft_logits(out)[0]
    want = reference_logits(weights, model.get_input_embeddings().weight.detach(), layer_inputs, tokens, 4, 2)
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backend, tree", [("kernels", True), ("kernels", False), ("torch", True), ("hf", False)])
def test_an_eagle3_head_keeps_greedy_output(model, tmp_path, backend, tree):
    """A random head drafts poorly, but the output must be exactly the target's (float32), trees and chains."""
    target = loaded(model, backend)
    write_eagle3(tmp_path / "head", model, draft_vocab=model.config.vocab_size // 2)
    drafter = create_drafter("eagle", target, eagle_head=tmp_path / "head", tree=tree)
    assert drafter.feature_layers == LAYERS  # declared, asked of the target with each pass
    decoder = SpecDecoder(target, drafter, SpeculationConfig(num_speculative_tokens=4))
    assert drafted_keeping_greedy_output(decoder, target) > 0


def test_the_default_feature_layers_apply_without_eagle_config(model, tmp_path):
    target = loaded(model, "torch")
    write_eagle3(tmp_path / "head", model, layers=None)
    assert load_eagle3_head(tmp_path / "head", target).feature_layers == default_feature_layers(8)


def test_layer_ids_follow_each_engines_convention():
    """vLLM's top-level ids name the layers whose inputs are read, SpecForge's and SGLang's eagle_config ids the
    layers whose outputs are (one less); the top-level ids win; heads specdec saved before writing them named
    inputs in eagle_config."""
    from specdec.drafters.eagle3_head import aux_layer_fields, feature_layers_of

    assert feature_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}, 30) == (2, 15, 27)
    assert feature_layers_of({"eagle_aux_hidden_state_layer_ids": [2, 15, 27],
                              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [9, 9, 9]}}, 30) == (2, 15, 27)
    assert feature_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}, "specdec": {}},
                             30) == (2, 15, 27)
    assert feature_layers_of({}, 30) == (2, 15, 27)
    assert feature_layers_of(aux_layer_fields((3, 5, 6)), 8) == (3, 5, 6)
    assert aux_layer_fields((0, 1)) == {"eagle_aux_hidden_state_layer_ids": [0, 1]}  # the embedding is no output


@pytest.mark.parametrize("change, error, message", [
    ({"fc.weight": torch.zeros(64, 128).half()}, IncompatibleDraftError, "does not fit"),  # fc over 2 layers, not 3
    ({"norm.weight": None}, ModelLoadError, "missing tensors norm.weight"),
    ({"medusa_head.0.weight": torch.zeros(4, 4).half()}, ModelLoadError, "unexpected tensors medusa_head"),
    ({"d2t": None}, ModelLoadError, "no d2t"),
    ({"d2t": torch.full((40,), 1000)}, ModelLoadError, "does not map"),
    ({"embed_tokens.weight": torch.zeros(10, 64).half()}, IncompatibleDraftError, "embedding of shape"),
])
def test_a_head_outside_the_layout_is_refused(model, tmp_path, change, error, message):
    target = loaded(model, "torch")
    write_eagle3(tmp_path / "head", model, **change)
    with pytest.raises(error, match=message):
        load_eagle3_head(tmp_path / "head", target)


def test_heads_for_other_targets_are_refused(model, tmp_path):
    target = loaded(model, "torch")
    write_eagle3(tmp_path / "layer", model, layers=(2, 4, 8))
    with pytest.raises(IncompatibleDraftError, match="reads target layer 8"):
        load_eagle3_head(tmp_path / "layer", target)
    write_eagle3(tmp_path / "wide", tiny_llama(seed=0, hidden=32, heads=4, kv_heads=2, layers=8))
    with pytest.raises(IncompatibleDraftError, match="hidden size 32"):
        load_eagle3_head(tmp_path / "wide", target)
    other = tiny_llama(seed=3, hidden=64, heads=4, kv_heads=2, layers=8)  # the same sizes, other weights
    new_eagle3_head(other, "other", torch.arange(32), LAYERS).save(tmp_path / "mine")
    with pytest.raises(IncompatibleDraftError, match="trained for target 'other'"):
        load_eagle3_head(tmp_path / "mine", target)


def test_a_pickled_head_is_refused(model, tmp_path):
    target = loaded(model, "torch")
    write_eagle3(tmp_path / "head", model)
    (tmp_path / "head" / "model.safetensors").rename(tmp_path / "head" / "pytorch_model.bin")
    with pytest.raises(ModelLoadError, match="pickle"):
        create_drafter("eagle", target, eagle_head=tmp_path / "head")


def test_specdec_heads_save_in_the_authors_layout_and_reload(model, tmp_path):
    target = loaded(model, "torch")
    ids = torch.tensor([1, 4, 9, 16, 25, 36, 49, 63])
    torch.manual_seed(0)
    head = new_eagle3_head(model, "tiny", ids, LAYERS)
    head.save(tmp_path / "head", dtype=torch.float32, extra={"note": "test"})
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 8
    assert config["eagle_aux_hidden_state_layer_ids"] == list(LAYERS)  # vLLM's convention: the inputs read
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in LAYERS]  # SGLang's
    from safetensors.torch import load_file

    tensors = load_file(str(tmp_path / "head" / "model.safetensors"))
    assert torch.equal(tensors["d2t"] + torch.arange(8), ids) and int(tensors["t2d"].sum()) == 8
    assert tensors["fc.weight"].shape == (64, 192) and "midlayer.self_attn.q_proj.weight" in tensors
    back = load_eagle3_head(tmp_path / "head", target)
    assert torch.equal(back.draft_ids, ids)
    for name, tensor in head.trainable_state().items():
        torch.testing.assert_close(back.trainable_state()[name], tensor)



def test_drafter_eagle3_needs_an_eagle3_head(model, tmp_path):
    from specdec.drafters.eagle_head import new_head

    target = loaded(model, "torch")
    with pytest.raises(ConfigError, match="no EAGLE-3 head is known for 'tiny'.*--kind eagle3"):
        create_drafter("eagle3", target)
    new_head(model, "tiny", torch.arange(64)).save(tmp_path / "eagle1")
    with pytest.raises(ConfigError, match="holds no EAGLE-3 head"):
        create_drafter("eagle3", target, eagle_head=tmp_path / "eagle1")
    drafter = create_drafter("eagle", target, eagle_head=tmp_path / "eagle1")
    assert torch.equal(drafter.columns, torch.arange(64))  # the final state


def test_drafters_are_named_as_asked_and_unknown_options_are_refused(model, tmp_path):
    """The eagle3 drafter is called "eagle3" (its costs, metrics and select's candidates are kept apart from
    eagle's); an option that no drafter takes is an error naming it, never silently dropped."""
    target = loaded(model, "torch")
    write_eagle3(tmp_path / "head", model)
    assert create_drafter("eagle3", target, eagle_head=tmp_path / "head").name == "eagle3"
    assert create_drafter("eagle3", target, eagle_head=tmp_path / "head").fork().name == "eagle3"
    assert create_drafter("eagle", target, eagle_head=tmp_path / "head").name == "eagle"
    chosen = create_drafter("select", target, eagle_head=tmp_path / "head", select_from="eagle,eagle3,ngram")
    assert list(chosen.candidates) == ["eagle", "eagle3", "ngram"]  # once refused as the same candidate twice
    with pytest.raises(ConfigError, match="unknown drafter option eagle_haed; the drafters take: .*eagle_head"):
        create_drafter("eagle3", target, eagle_haed=tmp_path / "head")
    with pytest.raises(ConfigError, match="unknown drafter options max_m, mn_n"):
        create_drafter("ngram", target, mn_n=1, max_m=3)
    # an option of another drafter is one of the shared set: the n-gram drafter does not take it
    assert create_drafter("ngram", target, eagle_head=tmp_path / "head").name == "ngram"


def test_an_eagle3_drafter_leaves_the_shared_target_as_it_was(model, tmp_path):
    """Building an EAGLE-3 drafter on a target changes nothing another decoder sharing it sees: the target's
    hidden states keep their width, and an EAGLE-1 decoder on it generates the same tokens, before and after."""
    from specdec.config import GenerationConfig
    from specdec.drafters.eagle import EagleDrafter
    from specdec.drafters.eagle_head import new_head

    target = loaded(model, "kernels")
    torch.manual_seed(1)
    other = SpecDecoder(target, EagleDrafter(new_head(target.hf_model, "tiny", torch.arange(64))),
                        SpeculationConfig(num_speculative_tokens=4))
    prompt, config = [1, 5, 9, 13, 2, 7, 30, 4], GenerationConfig(max_new_tokens=12, ignore_eos=True)

    def width() -> int:
        cache = target.backend.new_cache()
        try:
            return target.backend.forward(cache, torch.tensor(prompt), output_hidden=True).hidden.shape[-1]
        finally:
            target.backend.release(cache)

    before, before_width = other.generate_ids(prompt, config)[0], width()
    write_eagle3(tmp_path / "head", model, draft_vocab=model.config.vocab_size // 2)
    eagle3 = SpecDecoder(target, create_drafter("eagle", target, eagle_head=tmp_path / "head"),
                         SpeculationConfig(num_speculative_tokens=4))
    assert eagle3.generate_ids(prompt, config)[0] == before  # greedy: the target's tokens either way
    assert width() == before_width == model.config.hidden_size
    assert other.generate_ids(prompt, config)[0] == before
