"""An EAGLE-3 draft head: the target's states at several depths and the next token in, the next token out.

At position t the head fuses the inputs of a few target layers at t (by default layers 2, L/2 and L-3 of L:
low, middle and high features; fc, A*H -> H) into g_t, then runs one decoder layer whose attention reads
[norm(e(x_{t+1})); norm(g_t)] (2H) and whose residual stream starts from g_t. Its output o_{t+1} (H) gives
logits for x_{t+2} through its own norm and LM head over a draft vocabulary (K tokens; draft index i is token
i + d2t[i]). Drafting feeds the head its own outputs: (o_{t+1}, x_{t+2}) -> o_{t+2}, and so on. Unlike
EAGLE-1/2, o is not trained to equal any target feature: training scores tokens only (training-time test).

Files use the EAGLE-3 authors' layout (SafeAILab/EAGLE, SpecForge, vLLM and SGLang read it): config.json (a
LlamaConfig with draft_vocab_size) and model.safetensors with fc, midlayer.*, norm, lm_head, d2t and t2d.
specdec's own heads add a "specdec" entry to config.json naming their target and its fingerprint; heads
from elsewhere are checked on their sizes instead.

The layers read are named twice in config.json, because the engines count them differently (aux_layer_fields):
vLLM reads the top-level eagle_aux_hidden_state_layer_ids as the layers whose inputs it captures (specdec's
convention; vllm/v1/worker/gpu_model_runner.py, _get_eagle3_aux_layers_from_config, and the capture in
models/llama.py), while SGLang and SpecForge read eagle_config.eagle_aux_hidden_state_layer_ids as layers whose
outputs they capture (SGLang's set_eagle3_layers_to_capture adds 1; SpecForge hooks each layer's output).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn

from . import eagle_head
from .eagle_head import EagleConfig, HeadLayer, RMSNorm, frozen_parts

CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
ARCHITECTURE = "LlamaForCausalLMEagle3"


def default_feature_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs EAGLE-3 reads by default: 2, L/2 and L-3 (the authors' and vLLM's choice),
    kept within the layers and distinct for targets of fewer than 8 layers."""
    layers = [min(max(i, 0), num_layers - 1) for i in (2, num_layers // 2, num_layers - 3)]
    return tuple(sorted(set(layers)))


def aux_layer_fields(layers: tuple[int, ...]) -> dict:
    """config.json's entries naming the target layers a head reads (their inputs, specdec's convention), for both
    engines: the top-level ids as they are (vLLM), eagle_config's one less (the outputs of the layers before them:
    SGLang and SpecForge). eagle_config's ids are left out when layer 0 is read: its input, the embedding, is no
    layer's output. Worked example: layers (2, 15, 27) -> top level [2, 15, 27], eagle_config [1, 14, 26]."""
    fields: dict = {"eagle_aux_hidden_state_layer_ids": list(layers)}
    if min(layers) >= 1:
        fields["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in layers],
            "use_aux_hidden_state": True,
        }
    return fields


def feature_layers_of(data: dict, num_layers: int) -> tuple[int, ...]:
    """The target layers whose inputs a head reads, from its config.json: the top-level ids (vLLM's convention,
    specdec's), else eagle_config's plus one (SpecForge's and SGLang's, layer outputs), else the default. Heads
    specdec saved before it wrote the top-level ids (a "specdec" entry without them) named inputs in eagle_config."""
    if data.get("eagle_aux_hidden_state_layer_ids"):
        return tuple(int(i) for i in data["eagle_aux_hidden_state_layer_ids"])
    ids = (data.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids:
        shift = 0 if "specdec" in data else 1
        return tuple(int(i) + shift for i in ids)
    return default_feature_layers(num_layers)


@dataclass(frozen=True)
class Eagle3Config(EagleConfig):
    """EagleConfig's sizes (target None for heads from elsewhere), the layers read, and whether fc has a bias."""

    input_norm: bool = True  # always: the embedding is normed before attention
    feature_layers: tuple[int, ...] = ()  # target layers whose inputs are fused (A of them)
    fc_bias: bool = False


def config_for_target(
    hf_model, name: str, draft_vocab_size: int, feature_layers: tuple[int, ...] | None = None
) -> Eagle3Config:
    shape = eagle_head.config_for_target(hf_model, name, draft_vocab_size)
    layers = tuple(feature_layers or default_feature_layers(hf_model.config.num_hidden_layers))
    return Eagle3Config(**{**asdict(shape), "feature_layers": layers, "fc_bias": False})


class Eagle3Head(HeadLayer):
    """Trainable: fc, the decoder layer, the final norm and the draft LM head. Frozen buffers: the target's
    embedding, draft_ids and RoPE."""

    predicts_features = False  # trained on tokens only

    def __init__(
        self,
        config: Eagle3Config,
        embed: torch.Tensor,
        draft_ids: torch.Tensor,
        inv_freq: torch.Tensor,
        lm_head: torch.Tensor | None = None,
    ):
        """lm_head: initial draft LM head rows (K, H), e.g. the target's rows of the draft vocabulary."""
        H = config.hidden_size
        super().__init__(config, attention_input=2 * H)
        self.fc = nn.Linear(len(config.feature_layers) * H, H, bias=config.fc_bias)
        self.hidden_norm = RMSNorm(H, config.rms_norm_eps)
        self.input_norm = RMSNorm(H, config.rms_norm_eps)
        self.norm = RMSNorm(H, config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.draft_vocab_size, bias=False)
        if lm_head is not None:
            with torch.no_grad():
                self.lm_head.weight.copy_(lm_head)
        self.register_buffer("embed", embed.detach(), persistent=False)  # (V, H)
        self.register_buffer("draft_ids", draft_ids.long(), persistent=False)  # (K,) draft index -> token id
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        return self.config.feature_layers

    @property
    def feature_dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's layer inputs (..., A*H), in feature_layers order -> the head's input state (..., H)."""
        return self.fc(features.to(self.fc.weight.dtype))

    def forward(
        self,
        hidden: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None = None,
        mask: torch.Tensor | None = None,
    ):
        """hidden (B, T, H): fused target states (fuse) or the head's own outputs; tokens (B, T): x_{t+1};
        positions (B, T); past and mask as in EagleHead.forward. Returns (outputs (B, T, H), (keys, values))."""
        both = torch.cat([self.input_norm(self.embed[tokens].to(hidden.dtype)), self.hidden_norm(hidden)], dim=-1)
        return self.layer(hidden, both, positions, past, mask)

    def draft_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., K) logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden))

    # ---- files ------------------------------------------------------------------------------------
    def save(self, folder: Path, dtype: torch.dtype = torch.bfloat16, extra: dict | None = None) -> None:
        """config.json + model.safetensors in the EAGLE-3 authors' layout (KEYS), with a "specdec" entry."""
        from safetensors.torch import save_file

        from ...files import write_atomic, write_text_atomic

        folder.mkdir(parents=True, exist_ok=True)
        inverse = {mine: theirs for theirs, mine in KEYS.items()}
        tensors = {inverse[k]: v.to(dtype) for k, v in self.trainable_state().items()}
        K = len(self.draft_ids)
        tensors["d2t"] = (self.draft_ids.cpu() - torch.arange(K)).to(torch.int64).contiguous()
        t2d = torch.zeros(self.config.vocab_size, dtype=torch.bool)
        t2d[self.draft_ids.cpu()] = True
        tensors["t2d"] = t2d
        write_atomic(folder / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
        c = self.config
        data = {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": c.hidden_size,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads,
            "head_dim": c.head_dim,
            "intermediate_size": c.intermediate_size,
            "rms_norm_eps": c.rms_norm_eps,
            "vocab_size": c.vocab_size,
            "draft_vocab_size": K,
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "bias": c.fc_bias,
            "tie_word_embeddings": False,
            "torch_dtype": str(dtype).replace("torch.", ""),
            **aux_layer_fields(c.feature_layers),
            "specdec": {
                "target": c.target,
                "target_fingerprint": c.target_fingerprint,
                **({"training": extra} if extra else {}),
            },
        }
        write_text_atomic(folder / CONFIG_FILE, json.dumps(data, indent=1))


# the authors' tensor names -> Eagle3Head's
KEYS = {
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    "midlayer.hidden_norm.weight": "hidden_norm.weight",
    "midlayer.input_layernorm.weight": "input_norm.weight",
    **{f"midlayer.self_attn.{p}_proj.weight": f"{p}_proj.weight" for p in "qkvo"},
    **{f"midlayer.mlp.{p}_proj.weight": f"{p}_proj.weight" for p in ("gate", "up", "down")},
    "midlayer.post_attention_layernorm.weight": "post_norm.weight",
    "norm.weight": "norm.weight",
    "lm_head.weight": "lm_head.weight",
}


def new_eagle3_head(
    hf_model, name: str, draft_ids: torch.Tensor, feature_layers: tuple[int, ...] | None = None
) -> Eagle3Head:
    """A fresh head for this target: the draft LM head starts as the target's rows, fc as the identity on the
    deepest feature layer's input (plus small noise), the residual branches small."""
    config = config_for_target(hf_model, name, len(draft_ids), feature_layers)
    embed, lm_head, _, inv_freq = frozen_parts(hf_model, draft_ids)
    head = Eagle3Head(config, embed, draft_ids, inv_freq, lm_head=lm_head[draft_ids])
    with torch.no_grad():
        H, deepest = config.hidden_size, max(range(len(config.feature_layers)), key=lambda j: config.feature_layers[j])
        head.fc.weight.normal_(0, 0.02)
        head.fc.weight[:, deepest * H : (deepest + 1) * H] += torch.eye(H)
        for lin in (head.o_proj, head.down_proj):
            lin.weight.mul_(0.1)
    return head
