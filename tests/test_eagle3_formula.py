"""What an EAGLE-3 head reads and computes: the target returns the inputs of the asked feature layers (as
transformers' hidden_states) on three backends, the default layers and each engine's convention for naming them, and
a random head in its authors' file layout computing the formula written out (torch and kernel products)."""
import math

import pytest
import torch
import torch.nn.functional as F

from specdec.drafters.base import feature_columns
from specdec.drafters.heads.eagle3_head import default_feature_layers
from specdec.drafters.heads.eagle3_loading import load_eagle3_head
from specdec.errors import ConfigError
from specdec.models.backend import check_feature_layers
from eagle3_heads import LAYERS, THETA, write_eagle3
from tiny import loaded


def test_default_feature_layers():
    assert default_feature_layers(32) == (2, 16, 29)  # Llama-3.1-8B: the authors' choice
    assert default_feature_layers(30) == (2, 15, 27)  # smollm2-135m
    assert default_feature_layers(2) == (0, 1)  # small targets: within range, distinct


@pytest.mark.parametrize("backend", ["kernels", "torch", "hf"])
def test_the_target_returns_the_inputs_of_its_feature_layers(eagle3_target, backend):
    """After the final hidden state come the inputs of the asked layers (transformers' hidden_states[i]), in the
    order asked with each pass, in a prefill and a later batched pass alike; columns find each layer; a layer
    outside the model is refused."""
    target = loaded(eagle3_target, backend)
    ids = torch.tensor([1, 5, 9, 13, 2, 7])
    with torch.no_grad():
        states = eagle3_target(ids[None], output_hidden_states=True).hidden_states
    asked = (5, 2, 4)
    cache = target.backend.new_cache()
    first = target.backend.forward(cache, ids[:4], output_hidden=True, feature_layers=asked).hidden
    later = target.backend.forward_batch([cache], [ids[4:]], output_hidden=True, feature_layers=asked)[0].hidden
    hidden = torch.cat([first, later]).float()
    H = eagle3_target.config.hidden_size
    assert hidden.shape == (6, 4 * H)
    torch.testing.assert_close(hidden[:, :H], states[-1][0], atol=2e-4, rtol=1e-4)
    columns = feature_columns(asked, LAYERS, H)
    torch.testing.assert_close(hidden[:, columns], torch.cat([states[i][0] for i in (-1, *LAYERS)], -1), atol=2e-4,
                               rtol=1e-4)
    with pytest.raises(ConfigError, match="outside"):
        check_feature_layers((8,), target.info.num_layers)


def test_the_default_feature_layers_apply_without_eagle_config(eagle3_target, tmp_path):
    target = loaded(eagle3_target, "torch")
    write_eagle3(tmp_path / "head", eagle3_target, layers=None)
    assert load_eagle3_head(tmp_path / "head", target).feature_layers == default_feature_layers(8)


def test_layer_ids_follow_each_engines_convention():
    """vLLM's top-level ids name the layers whose inputs are read, SpecForge's and SGLang's eagle_config ids the
    layers whose outputs are (one less); the top-level ids win; heads specdec saved before writing them named
    inputs in eagle_config."""
    from specdec.drafters.heads.eagle3_head import aux_layer_fields, feature_layers_of

    assert feature_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 14, 26]}}, 30) == (2, 15, 27)
    assert feature_layers_of({"eagle_aux_hidden_state_layer_ids": [2, 15, 27],
                              "eagle_config": {"eagle_aux_hidden_state_layer_ids": [9, 9, 9]}}, 30) == (2, 15, 27)
    assert feature_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 15, 27]}, "specdec": {}},
                             30) == (2, 15, 27)
    assert feature_layers_of({}, 30) == (2, 15, 27)
    assert feature_layers_of(aux_layer_fields((3, 5, 6)), 8) == (3, 5, 6)
    assert aux_layer_fields((0, 1)) == {"eagle_aux_hidden_state_layer_ids": [0, 1]}  # the embedding is no output


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
def test_a_published_head_computes_the_published_formula(eagle3_target, tmp_path, products):
    target = loaded(eagle3_target, "kernels")
    weights, draft_ids = write_eagle3(tmp_path / "head", eagle3_target)
    head = load_eagle3_head(tmp_path / "head", target)
    assert head.feature_layers == LAYERS and torch.equal(head.draft_ids, draft_ids)
    if products == "kernels":
        from specdec.drafters.heads.eagle_kernels import KernelEagle3Head, kernel_head_problem

        if kernel_head_problem(head.config):
            pytest.skip(f"the CPU kernels cannot run here: {kernel_head_problem(head.config)}")
        head = KernelEagle3Head(head)
    ids = torch.tensor([3, 9, 14, 2, 30, 7, 11])
    with torch.no_grad():
        states = eagle3_target(ids[None], output_hidden_states=True).hidden_states
    layer_inputs = torch.cat([states[i][0] for i in LAYERS], -1)
    tokens = torch.tensor([9, 14, 2, 30, 7, 11, 5])  # x_{t+1} of each pair
    with torch.no_grad():
        out, _ = head(head.fuse(layer_inputs)[None], tokens[None], torch.arange(7)[None])
        logits = head.draft_logits(out)[0]
    want = reference_logits(weights, eagle3_target.get_input_embeddings().weight.detach(), layer_inputs, tokens, 4, 2)
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
