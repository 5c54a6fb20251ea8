"""Named shapes of public models, built with seeded random weights: speed figures on real shapes, no download.

Each shape is its family's transformers config class filled with the values of the public config.json on the
Hugging Face hub (`source`). The model is built directly on the asked device and dtype with transformers' own
initialisation (normal, std initializer_range; so logits stay in a sane range), with no tokenizer: prompts are
random token ids. Outputs of random weights mean nothing, so a shape gives speed only, never acceptance.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ..errors import ConfigError

if TYPE_CHECKING:  # torch and transformers load when a shape is built: the CLI lists shapes without them
    import torch

    from .backend import CausalLM
    from .loading import LoadedModel


@dataclass(frozen=True)
class ModelShape:
    name: str
    source: str  # the hub repository whose config.json the values copy
    config_class: str  # transformers config class of the family
    values: dict = field(default_factory=dict)  # config.json keys, as the hub gives them


def _llama3_rope(factor: float) -> dict:
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }


SHAPES: dict[str, ModelShape] = {
    s.name: s
    for s in [
        ModelShape(
            "smollm2-135m",
            "HuggingFaceTB/SmolLM2-135M-Instruct",
            "LlamaConfig",
            dict(
                hidden_size=576,
                intermediate_size=1536,
                num_hidden_layers=30,
                num_attention_heads=9,
                num_key_value_heads=3,
                head_dim=64,
                vocab_size=49152,
                tie_word_embeddings=True,
                rope_theta=100000.0,
                max_position_embeddings=8192,
                rms_norm_eps=1e-5,
                initializer_range=0.041666666666666664,
            ),
        ),
        ModelShape(
            "llama-3.2-1b",
            "meta-llama/Llama-3.2-1B",
            "LlamaConfig",
            dict(
                hidden_size=2048,
                intermediate_size=8192,
                num_hidden_layers=16,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=64,
                vocab_size=128256,
                tie_word_embeddings=True,
                rope_theta=500000.0,
                rope_scaling=_llama3_rope(32.0),
                max_position_embeddings=131072,
                rms_norm_eps=1e-5,
                initializer_range=0.02,
            ),
        ),
        ModelShape(
            "qwen2.5-0.5b",
            "Qwen/Qwen2.5-0.5B",
            "Qwen2Config",
            dict(
                hidden_size=896,
                intermediate_size=4864,
                num_hidden_layers=24,
                num_attention_heads=14,
                num_key_value_heads=2,
                vocab_size=151936,
                tie_word_embeddings=True,
                rope_theta=1000000.0,
                max_position_embeddings=32768,
                sliding_window=32768,
                use_sliding_window=False,
                max_window_layers=24,
                rms_norm_eps=1e-6,
                initializer_range=0.02,
            ),
        ),
        ModelShape(
            "qwen3-0.6b",
            "Qwen/Qwen3-0.6B",
            "Qwen3Config",
            dict(
                hidden_size=1024,
                intermediate_size=3072,
                num_hidden_layers=28,
                num_attention_heads=16,
                num_key_value_heads=8,
                head_dim=128,
                vocab_size=151936,
                tie_word_embeddings=True,
                rope_theta=1000000.0,
                max_position_embeddings=40960,
                sliding_window=None,
                use_sliding_window=False,
                max_window_layers=28,
                attention_bias=False,
                rms_norm_eps=1e-6,
                initializer_range=0.02,
            ),
        ),
        ModelShape(
            "gemma-3-1b",
            "google/gemma-3-1b-pt",
            "Gemma3TextConfig",
            dict(
                hidden_size=1152,
                intermediate_size=6912,
                num_hidden_layers=26,
                num_attention_heads=4,
                num_key_value_heads=1,
                head_dim=256,
                vocab_size=262144,
                tie_word_embeddings=True,
                rope_theta=1000000.0,
                rope_local_base_freq=10000.0,
                sliding_window=512,
                sliding_window_pattern=6,
                max_position_embeddings=32768,
                query_pre_attn_scalar=256,
                hidden_activation="gelu_pytorch_tanh",
                attn_logit_softcapping=None,
                final_logit_softcapping=None,
                rms_norm_eps=1e-6,
                initializer_range=0.02,
            ),
        ),
        ModelShape(
            "llama-3.1-8b",
            "meta-llama/Llama-3.1-8B",
            "LlamaConfig",
            dict(
                hidden_size=4096,
                intermediate_size=14336,
                num_hidden_layers=32,
                num_attention_heads=32,
                num_key_value_heads=8,
                head_dim=128,
                vocab_size=128256,
                tie_word_embeddings=False,
                rope_theta=500000.0,
                rope_scaling=_llama3_rope(8.0),
                max_position_embeddings=131072,
                rms_norm_eps=1e-5,
                initializer_range=0.02,
            ),
        ),
    ]
}


def get_shape(name: str) -> ModelShape:
    if name not in SHAPES:
        raise ConfigError(f"unknown shape {name!r}; choose from {', '.join(SHAPES)}")
    return SHAPES[name]


def shape_config(name: str):
    """The transformers config of a shape. It has no EOS token (every run makes exactly the tokens asked for),
    and a pad id only so that transformers' generate does not warn."""
    import transformers

    shape = get_shape(name)
    values = {"pad_token_id": 0, **shape.values, "eos_token_id": None}
    config = getattr(transformers, shape.config_class)(**values)
    config._name_or_path = f"shape:{name}"
    return config


def count_parameters(name: str) -> int:
    """Parameters of the shape's causal LM (tied weights once), built on the meta device: nothing is allocated."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(shape_config(name))
    return sum(p.numel() for p in model.parameters())


def weight_bytes(hf_model) -> int:
    """Bytes of the model's parameters (tied weights once)."""
    return sum(p.numel() * p.element_size() for p in hf_model.parameters())


def bytes_read_per_token(hf_model) -> int:
    """Bytes of weights one decoding step reads: all of them, but of an input embedding that is not also the
    output layer, a row alone."""
    embed = hf_model.get_input_embeddings().weight
    untied = embed.data_ptr() != hf_model.get_output_embeddings().weight.data_ptr()
    return weight_bytes(hf_model) - (embed.numel() - embed.shape[1]) * embed.element_size() * untied


def build_shape_model(name: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """The shape's transformers causal LM with random weights drawn from `seed`, allocated on `device` in
    `dtype` (never on the CPU first), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = shape_config(name)
    torch.manual_seed(seed)  # seeds the CUDA generators too
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


class _NoTokenizer:
    """Stands in for a tokenizer: shapes take token ids, and have no EOS."""

    eos_token_id = None
    chat_template = None


@dataclass
class ShapeModel:
    shape: ModelShape
    loaded: LoadedModel
    backend_name: str  # kernels, torch or hf: the forward that runs specdec's decoding
    fast_path_problem: str | None  # why it fell back to transformers' forward (hf), else None
    kernels_problem: str | None  # why `auto` on the CPU did not take the kernels, else None


BACKEND_NAMES = {"KernelLlama": "kernels", "FastLlama": "torch", "HFBackend": "hf"}


def backend_name(backend: CausalLM) -> str:
    """specdec's name of the backend that runs, or its class name for one this table does not know."""
    return BACKEND_NAMES.get(type(backend).__name__, type(backend).__name__)


def load_shape(
    name: str,
    device: str = "auto",
    dtype: str = "auto",
    backend: str = "auto",
    seed: int = 0,
    max_context: int = 2048,
    graphs: str = "auto",
    compile: str = "auto",
) -> ShapeModel:
    """The shape on specdec's backend selection (make_backend, as for a loaded model), with a KV cache of
    max_context tokens (the shapes' own contexts, up to 131072, would take gigabytes); graphs, compile: as
    load_model's."""
    from .family import fast_path_problem
    from .backend_choice import make_backend
    from .devices import resolve_device, resolve_dtype
    from .loading import LoadedModel, model_info

    shape = get_shape(name)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev)
    hf_model = build_shape_model(name, dev, torch_dtype, seed)
    info = model_info(f"shape:{name}", hf_model, _NoTokenizer(), dev, torch_dtype)
    info = replace(info, max_context=min(max_context, info.max_context))
    made = make_backend(hf_model, info, backend, max_context=max_context, graphs=graphs, compile=compile)
    loaded = LoadedModel(name=f"shape:{name}", hf_model=hf_model, tokenizer=None, backend=made)
    ran = backend_name(made)
    problem = fast_path_problem(hf_model.config) if ran == "hf" else None
    return ShapeModel(shape, loaded, ran, problem, _kernels_problem(hf_model, dev, backend, ran))


def _kernels_problem(hf_model, device: torch.device, asked: str, ran: str) -> str | None:
    """Why `auto` on the CPU ran the torch forward rather than the kernels (None where that question is moot)."""
    if asked != "auto" or device.type != "cpu" or ran != "torch":
        return None
    from ..kernels import unavailable_reason
    from .kernel_args import kernel_shape_problem

    return unavailable_reason() or kernel_shape_problem(hf_model.config) or "the kernels refused the model"
