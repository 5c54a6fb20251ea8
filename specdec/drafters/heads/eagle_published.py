"""EAGLE-1 and EAGLE-2 draft heads as their authors publish them (SafeAILab/EAGLE, eagle/model/cnets1.py).

A folder holds config.json (a LlamaConfig of the head, num_hidden_layers 1) and the weights: fc (2H -> H) over
cat(embedding of x_{t+1}, f_t), one Llama decoder layer whose layer 0 has no input_layernorm, and sometimes a copy of
the target's embedding (ignored: the target's own is used). f_t is the target's final hidden state after its final
norm, and the head's output goes to the target's whole LM head: specdec's conventions, with the full vocabulary as
draft vocabulary. RoPE follows the head's config.json. The files name no target, so sizes are checked instead.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch

from ...errors import IncompatibleDraftError, ModelLoadError
from ...files import tensor_names_problem
from .eagle_head import CONFIG_FILE, HEAD_FILE, EagleConfig, EagleHead, config_for_target, frozen_parts

WEIGHT_FILES = ("model.safetensors", "pytorch_model.safetensors")
PICKLE_FILE = "pytorch_model.bin"
CONVERT = (
    'python -c "import torch; from safetensors.torch import save_file; save_file({k: v.contiguous() for k, v '
    "in torch.load('pytorch_model.bin', map_location='cpu', weights_only=True).items()}, 'model.safetensors')\""
)

# the authors' tensor names -> EagleHead's
KEYS = {
    "fc.weight": "fc.weight",
    "fc.bias": "fc.bias",
    **{f"layers.0.self_attn.{p}_proj.weight": f"{p}_proj.weight" for p in "qkvo"},
    **{f"layers.0.mlp.{p}_proj.weight": f"{p}_proj.weight" for p in ("gate", "up", "down")},
    "layers.0.post_attention_layernorm.weight": "post_norm.weight",
}
EMBED_KEY = "embed_tokens.weight"


def load_published(folder: Path, target) -> EagleHead:
    """An EAGLE-1/2 head from its authors' files, onto the target (a LoadedModel) whose sizes it must have."""
    from ...files import read_tensors

    weights = _weights_file(folder)
    data = _read_config(folder)
    config = _config(data, folder, target)
    state = _state(read_tensors(weights, "the EAGLE head"), weights, target, bias=data.get("bias", True))
    embed, lm_head, draft_ids, _ = frozen_parts(target.hf_model, torch.arange(config.vocab_size))
    head = EagleHead(config, embed, lm_head, draft_ids, rope_frequencies(data, config.head_dim, folder))
    try:
        head.load_state_dict(state)
    except RuntimeError as e:
        raise IncompatibleDraftError(
            f"the EAGLE head in {folder} does not fit its own config.json: {str(e).splitlines()[-1].strip()}"
        ) from None
    return head.eval()


def _weights_file(folder: Path) -> Path:
    """The head's safetensors file; a pickle alone is refused with the command that converts it."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    if (folder / PICKLE_FILE).is_file():
        raise ModelLoadError(
            f"{folder} holds the EAGLE head as a pickle ({PICKLE_FILE}), which specdec does not "
            f"load: convert it to safetensors once, in that folder, with: {CONVERT}"
        )
    raise ModelLoadError(
        f"{folder} holds no EAGLE head ({HEAD_FILE} + {CONFIG_FILE}, or the EAGLE authors' "
        f"config.json + {WEIGHT_FILES[0]})"
    )


def _read_config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise ModelLoadError(f"{folder} holds EAGLE head weights but no config.json beside them")
    return json.loads(path.read_text())


def _config(data: dict, folder: Path, target) -> EagleConfig:
    """The head's config.json as an EagleConfig (full draft vocabulary, no input norm): the target's own
    (config_for_target), whose hidden size, attention heads and vocabulary size the head must have, with the head's
    attention, MLP and norm sizes."""
    missing = [k for k in ("hidden_size", "num_attention_heads", "intermediate_size", "vocab_size") if k not in data]
    if missing:
        raise ModelLoadError(f"{folder / 'config.json'} lacks {', '.join(missing)}")
    layers, act = data.get("num_hidden_layers", 1), data.get("hidden_act", "silu")
    if (layers, act) != (1, "silu"):
        raise ModelLoadError(
            f"{folder / 'config.json'} describes a head of {layers} layers with activation {act!r}; "
            f"specdec reads EAGLE heads of one layer with 'silu'"
        )
    mine = config_for_target(target.hf_model, str(folder), data["vocab_size"])
    for what, theirs, own in (
        ("hidden size", data["hidden_size"], mine.hidden_size),
        ("attention heads", data["num_attention_heads"], mine.num_heads),
        ("vocabulary size", data["vocab_size"], mine.vocab_size),
    ):
        if theirs != own:
            raise IncompatibleDraftError(
                f"the EAGLE head in {folder} has {what} {theirs}, but {target.name!r} has {own}"
            )
    heads = mine.num_heads
    return replace(
        mine,
        num_kv_heads=data.get("num_key_value_heads") or heads,
        head_dim=mine.hidden_size // heads,
        intermediate_size=data["intermediate_size"],
        rms_norm_eps=data.get("rms_norm_eps", 1e-6),
        input_norm=False,
        fc_bias=bool(data.get("bias", True)),
    )


def _state(tensors: dict[str, torch.Tensor], path: Path, target, bias: bool) -> dict[str, torch.Tensor]:
    """The authors' tensors under EagleHead's names (float32); their embedding copy is checked for shape, then
    dropped. bias: config.json's "bias" (False: fc has none, a zero bias here)."""
    embed = tensors.pop(EMBED_KEY, None)
    want = tuple(target.hf_model.get_input_embeddings().weight.shape)
    if embed is not None and tuple(embed.shape) != want:
        raise IncompatibleDraftError(
            f"the EAGLE head in {path.parent} holds an embedding of shape "
            f"{tuple(embed.shape)}, but {target.name!r} has {want}"
        )
    problem = tensor_names_problem(tensors, KEYS, () if bias else ("fc.bias",))
    if problem:
        raise ModelLoadError(f"{path} is not an EAGLE-1/2 head in its authors' layout: {problem}")
    state = {KEYS[k]: v.float() for k, v in tensors.items()}
    state.setdefault("fc.bias", torch.zeros(state["fc.weight"].shape[0]))
    return state


def rope_frequencies(data: dict, head_dim: int, folder: Path) -> torch.Tensor:
    """RoPE inverse frequencies (head_dim/2,) float32 from the head's config.json: rope_theta (default 10000) and
    rope_scaling, or transformers 5's rope_parameters; no scaling, linear (positions divided by its factor) or
    Llama 3's (the published EAGLE-3 heads for Llama 3.1; transformers' own formula)."""
    rope = {
        "rope_theta": data.get("rope_theta", 10000.0),
        **(data.get("rope_scaling") or {}),
        **(data.get("rope_parameters") or {}),
    }
    inv_freq = 1.0 / rope["rope_theta"] ** (torch.arange(0, head_dim, 2).float() / head_dim)
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / rope["factor"]
    if kind == "llama3":  # a fixed rescaling of the frequencies by wavelength, no change of attention scale
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        heads = data.get("num_attention_heads", 1)
        config = LlamaConfig(  # type: ignore[call-arg]  # its typed signature leaves out the RoPE settings it reads
            hidden_size=head_dim * heads,
            num_attention_heads=heads,
            head_dim=head_dim,
            rope_theta=rope["rope_theta"],
            rope_scaling={**rope, "rope_type": "llama3"},
            max_position_embeddings=data.get("max_position_embeddings", 2048),
        )
        return ROPE_INIT_FUNCTIONS["llama3"](config, None)[0].float()
    raise ModelLoadError(
        f"{folder / 'config.json'} asks for RoPE scaling {kind!r}; specdec reads EAGLE heads "
        f"without scaling or with linear or Llama 3 scaling"
    )
