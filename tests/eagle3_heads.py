"""Random EAGLE-3 heads written as their authors publish them, for tests (no published head is downloaded)."""
import json

import torch

LAYERS = (2, 4, 5)  # of the tiny target's 8 (conftest's eagle3_target)
THETA = 500000.0  # the head's own RoPE base, not the target's (10000)


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
