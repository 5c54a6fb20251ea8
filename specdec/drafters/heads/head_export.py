"""EAGLE heads written as vLLM and SGLang load them: the inverse of eagle_published.py and eagle3_head's loader.

A folder holds config.json (a LlamaConfig of the one-layer head, with the fields the engines read) and
model.safetensors (the authors' tensor names, plus the target's embedding, which the engines compare with the
target's and share, or keep as the head's own under pipeline parallelism). The target's RoPE (rope_theta,
rope_scaling, and transformers 5's rope_parameters) and context length go into config.json: the engines build the
head's rotary embedding from it, where specdec's own heads take the target's.

EAGLE-3 (one folder for both engines): architectures ["LlamaForCausalLMEagle3"]; fc (H x 3H, no bias),
midlayer.*, norm, lm_head (K x H), d2t (draft index i is token i + d2t[i]) and t2d; the layers read in both
engines' conventions (eagle3_head.aux_layer_fields), and draft_vocab_size.

EAGLE-1/2: the engines disagree, so the folder is for one of them.
- vLLM builds fc without a bias and names the architecture from "LlamaForCausalLM" (EAGLEConfig prefixes
  "Eagle"); an fc.bias tensor fails its load (a KeyError at e1c4a55214c6; dropped unread at 00da92319af4), so the
  file holds none and a head whose bias is not zero is refused.
- SGLang builds fc with a bias (nn.Linear's default; a missing tensor would stay randomly initialised) and
  looks up "LlamaForCausalLMEagle".
Both give layer 0 no input norm and draft over the target's whole LM head: a specdec head trained with an input
norm (its default) is refused, and a draft vocabulary of K < V tokens does not carry over (drafts may differ).
"bias" stays false in both: vLLM and SGLang read it as attention bias.

Matched against (read at these commits; no vLLM or SGLang was installed to load the files):
- vLLM: vllm/model_executor/models/llama_eagle3.py @ 00bd1493b3e8, llama_eagle.py @ e1c4a55214c6 and
  00da92319af4, vllm/transformers_utils/configs/eagle.py @ 23c5aa92d517, the registry's
  _SPECULATIVE_DECODING_MODELS and gpu_model_runner's _get_eagle3_aux_layers_from_config;
- SGLang: python/sglang/srt/models/llama_eagle3.py @ 03d5a7771f60, llama_eagle.py @ 034b3be819fa, llama.py @
  00239548f1cd (attention bias from config "bias"; aux-layer capture);
- SpecForge: specforge/modeling/target/eagle3_target_model.py @ 00c4bba336ce (layer ids are layer outputs).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ...errors import ConfigError
from .eagle3_head import Eagle3Head, aux_layer_fields
from .eagle_head import EagleHead, target_fingerprint

ENGINES = ("vllm", "sglang")
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
EAGLE1_ARCHITECTURE = {"vllm": "LlamaForCausalLM", "sglang": "LlamaForCausalLMEagle"}
EAGLE3_ARCHITECTURE = "LlamaForCausalLMEagle3"
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass(frozen=True)
class Export:
    """What was written: the folder, the kind ("eagle" or "eagle3"), the engines it is for, and notes on what does
    not carry over (one line each)."""

    folder: Path
    kind: str
    engines: tuple[str, ...]
    notes: tuple[str, ...] = ()


def check_out(out: Path) -> None:
    """Refuses an output path that is a file, or a folder holding anything but an earlier export's two files
    (specdec's own head files there would be loaded instead of the export)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; give a folder (created if missing)")
    if out.is_dir():
        others = sorted(p.name for p in out.iterdir() if p.name not in (CONFIG_FILE, WEIGHTS_FILE))
        if others:
            raise ConfigError(f"--out {out} is not empty (holds {', '.join(others[:3])}); give a new or empty folder")


def export_head(
    head: EagleHead | Eagle3Head, target, out: Path, engine: str | None = None, dtype: str = "bfloat16"
) -> Export:
    """Writes `head` (loaded onto `target`, a LoadedModel) to `out` for vLLM and SGLang; engine: "vllm" or "sglang",
    needed for EAGLE-1/2 heads (None: both, EAGLE-3 only). Files are written under temporary names, then renamed."""
    if engine is not None and engine not in ENGINES:
        raise ConfigError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    check_out(out)
    if isinstance(head, Eagle3Head):
        tensors, config, notes = eagle3_files(head, target, DTYPES[dtype])
        kind, engines = "eagle3", (engine,) if engine else ENGINES
    else:
        if engine is None:
            raise ConfigError(
                "vLLM and SGLang load EAGLE-1/2 heads differently (fc bias, architecture name): "
                "choose --engine vllm or --engine sglang"
            )
        tensors, config, notes = eagle_files(head, target, engine, DTYPES[dtype])
        kind, engines = "eagle", (engine,)
    embed = target.hf_model.get_input_embeddings().weight
    config["specdec_export"] = {
        "target": target.name,
        "target_fingerprint": target_fingerprint(embed),
        "engines": list(engines),
    }  # provenance; no engine reads it
    write_folder(Path(out), tensors, config)
    return Export(Path(out), kind, engines, tuple(notes))


def eagle3_files(head: Eagle3Head, target, dtype: torch.dtype) -> tuple[dict, dict, list[str]]:
    """(tensors, config, notes) of an EAGLE-3 head. The engines fuse exactly three target layers with an fc
    without bias, and capture no layer's input at layer 0 (SGLang's ids are outputs: layer -1 does not exist)."""
    from .eagle3_head import KEYS

    c = head.config
    layers = tuple(c.feature_layers)
    if len(layers) != 3 or min(layers) < 1 or c.fc_bias:
        raise ConfigError(
            f"vLLM and SGLang read EAGLE-3 heads that fuse three target layers after layer 0 without "
            f"an fc bias; this head reads layers {list(layers)}" + (" with an fc bias" if c.fc_bias else "")
        )
    theirs = {mine: name for name, mine in KEYS.items()}
    tensors = {theirs[k]: v.to(dtype) for k, v in head.trainable_state().items()}
    draft_ids = head.draft_ids.cpu()
    K = int(draft_ids.numel())
    tensors["d2t"] = (draft_ids - torch.arange(K)).to(torch.int64)  # (K,) offsets: token = index + d2t[index]
    t2d = torch.zeros(c.vocab_size, dtype=torch.bool)  # (V,) whether each token is in the draft vocabulary
    t2d[draft_ids] = True
    tensors["t2d"] = t2d
    tensors["embed_tokens.weight"] = _embedding(target, dtype)
    config = {
        **base_config(c, target, dtype),
        "architectures": [EAGLE3_ARCHITECTURE],
        "draft_vocab_size": K,
        "target_hidden_size": c.hidden_size,
        "norm_before_residual": False,
        **aux_layer_fields(layers),
    }
    return tensors, config, []


def eagle_files(head: EagleHead, target, engine: str, dtype: torch.dtype) -> tuple[dict, dict, list[str]]:
    """(tensors, config, notes) of an EAGLE-1/2 head for one engine."""
    from .eagle_published import KEYS

    c = head.config
    if c.input_norm:
        raise ConfigError(
            "this EAGLE head has a norm before attention (specdec's default when trained from "
            "scratch), which the EAGLE-1 layer of vLLM and SGLang lacks; fine-tune it into their layout "
            "(train-drafter --authors-layout --init-from HEAD), or export an EAGLE-3 head"
        )
    state = head.trainable_state()
    if engine == "vllm":
        bias = state.pop("fc.bias")
        if bool(bias.ne(0).any()):
            raise ConfigError(
                f"vLLM's EAGLE-1 head has no fc bias, and this head's is not zero (largest "
                f"{float(bias.abs().max()):.3g}): export it for SGLang (--engine sglang), or export an "
                f"EAGLE-3 head"
            )
    theirs = {mine: name for name, mine in KEYS.items()}
    tensors = {theirs[k]: v.to(dtype) for k, v in state.items()}
    tensors["embed_tokens.weight"] = _embedding(target, dtype)
    config = {**base_config(c, target, dtype), "architectures": [EAGLE1_ARCHITECTURE[engine]]}
    notes = []
    if c.draft_vocab_size < c.vocab_size:
        notes.append(
            f"{engine} drafts EAGLE-1/2 heads over the whole vocabulary ({c.vocab_size} tokens): this "
            f"head's draft vocabulary of {c.draft_vocab_size} does not carry over, so drafts may differ"
        )
    return tensors, config, notes


def base_config(c, target, dtype: torch.dtype) -> dict:
    """The LlamaConfig fields of a one-layer head both engines read (c: the head's EagleConfig)."""
    cfg = target.hf_model.config
    return {
        "model_type": "llama",
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_heads,
        "num_key_value_heads": c.num_kv_heads,
        "head_dim": c.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": c.rms_norm_eps,
        "vocab_size": c.vocab_size,
        "max_position_embeddings": getattr(cfg, "max_position_embeddings", 2048),
        **rope_fields(cfg),
        "tie_word_embeddings": False,
        "bias": False,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": str(dtype).replace("torch.", ""),
    }


def rope_fields(cfg) -> dict:
    """The target's RoPE as config.json fields: rope_theta and rope_scaling (None unless scaled), which
    transformers 4 and the engines built on it read, and rope_parameters, which transformers 5 reads."""
    params = dict(getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {})
    theta = float(params.pop("rope_theta", None) or getattr(cfg, "rope_theta", None) or 10000.0)
    kind = params.get("rope_type", params.get("type", "default"))
    scaling = None if kind == "default" else {**params, "rope_type": kind}
    return {
        "rope_theta": theta,
        "rope_scaling": scaling,
        "rope_parameters": {"rope_theta": theta, **(scaling or {"rope_type": "default"})},
    }


def _embedding(target, dtype: torch.dtype) -> torch.Tensor:
    """The target's input embedding (V, H) in `dtype`, on the CPU."""
    return target.hf_model.get_input_embeddings().weight.detach().to("cpu", dtype).contiguous()


def write_folder(out: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
    """model.safetensors, then config.json (a reader that finds the config finds the weights), each atomically."""
    from safetensors.torch import save_file

    from ...files import write_atomic, write_text_atomic

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.contiguous() for k, v in tensors.items()}
    write_atomic(out / WEIGHTS_FILE, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))
    write_text_atomic(out / CONFIG_FILE, json.dumps(config, indent=1))
