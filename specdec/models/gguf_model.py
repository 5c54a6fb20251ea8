"""A GGUF file run as it is: its quantized matrices kept in their formats on the CPU kernels, not dequantized.

transformers reads the file's config and tokenizer, and its names for the tensors (the same map and tensor
processors it uses to dequantize a file); the gguf package's reader maps the tensors' bytes (on a later load of the
same file, gguf_index maps them at the offsets the reader found). Matrices of the types in gguf_blocks.READERS
become the kernels' quantized weights (exactly the file's values, products with activations rounded to int8 per
group of 32: kernels/quantized.h); float tensors (F32, F16, BF16) stay floats; a matrix of any other type is
dequantized to float32, with one line naming its type. The model object that transformers' callers read (config,
generation settings) is a skeleton on the meta device: it holds no weights.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

from ..errors import ModelLoadError, first_line
from .gguf_blocks import READERS, GGUFMatrix

FLOAT_TYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
# GGUF architectures whose tensors this reader maps onto the kernels' Llama-family model
ARCHITECTURES = ("llama", "qwen2", "qwen3", "mistral")


def open_gguf(path: Path):
    """The gguf package's reader of the file (its metadata parsed, its tensors mapped); ModelLoadError in one line
    where the file is damaged or truncated. One reader serves a load: parsing a 128k-token vocabulary takes seconds."""
    from gguf import GGUFReader

    try:
        return GGUFReader(str(path))
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ModelLoadError(f"cannot read {path.name} as a GGUF file: {first_line(exc)}") from None


def drop_parsed_metadata(reader) -> None:
    """Frees the reader's parsed metadata once the config and tokenizer are made, keeping its tensors (their types,
    shapes and views of the mapped file). The reader parses every metadata value into small arrays, a vocabulary
    and its merges into hundreds of thousands of them; objects the load keeps, made while they live, share the
    heap's arenas with them and pin those arenas after they are freed. Freed before the model's long-lived
    objects are made, they are handed back whole (for smollm2's 94 MB Q4_1 file, 11 MB of the memory its load
    leaves resident, docs/gguf.md)."""
    reader.fields.clear()


def quantized_matrix_types(tensors) -> set[str]:
    """The types of the file's 2-D tensors (the reader's, or gguf_index's) that are neither float32, float16 nor
    bfloat16."""
    return {t.tensor_type.name for t in tensors if len(t.shape) == 2 and t.tensor_type.name not in FLOAT_TYPES}


def architecture_problem(config) -> str | None:
    """Why this reader cannot map the file's tensors onto the kernels' model (then it is dequantized), or None."""
    if config.model_type not in ARCHITECTURES:
        return f"its architecture {config.model_type!r} is not one of {', '.join(ARCHITECTURES)}"
    return None


def skeleton(config):
    """transformers' model for `config` on the meta device (no weights), with its rotary embedding on the CPU (the
    kernels' RoPE tables come from it)."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    with torch.device("cpu"):
        model.model.rotary_emb = type(model.model.rotary_emb)(config=model.config)
    model.generation_config = GenerationConfig.from_model_config(model.config)
    return model.eval()


def release_freed_memory() -> None:
    """Hands the heap's free pages back to the system after a load (glibc's malloc_trim; elsewhere nothing): the
    file's metadata (a 128k-token vocabulary is millions of small objects) and each matrix's numbers were freed,
    but stay resident until trimmed. Measured on a Llama-3.2-1B Q4_K_M file: 1.6-2.2x the file's size added to the
    process's resident memory before, 1.4x after."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def attach_float_tables(target) -> None:
    """Gives a quantized file's model skeleton (target.hf_model) its embeddings and LM head as float32 parameters,
    the file's values widened from the kernels' bytes, for drafters built on them (EAGLE, Medusa): vocab x hidden x
    4 bytes each (once, where the head is tied), on first use only."""
    model = target.hf_model
    embeddings = model.get_input_embeddings()
    if embeddings.weight.device.type != "meta":
        return
    embeddings.weight = torch.nn.Parameter(target.backend.float_matrix("embed"), requires_grad=False)
    head = model.get_output_embeddings()
    if target.backend.head_tied:
        head.weight = embeddings.weight
    else:
        head.weight = torch.nn.Parameter(target.backend.float_matrix("head"), requires_grad=False)


def _row_order(processor, name: str, rows: int) -> np.ndarray | None:
    """The permutation transformers' tensor processor applies to the rows of tensor `name` (Llama's q and k), found
    by running it on the row numbers; None where it keeps them in place."""
    index = np.arange(rows, dtype=np.float64).reshape(rows, 1)
    moved = np.asarray(processor.process(index, name).weights).reshape(-1)
    if np.array_equal(moved, index.reshape(-1)):
        return None
    if not np.array_equal(np.sort(moved), index.reshape(-1)):
        raise ModelLoadError(f"{name}: transformers changes this tensor's values, not only its rows' order")
    return moved.astype(np.int64)


def gguf_names(model, arch: str) -> dict[str, str]:
    """llama.cpp's tensor names -> transformers' for the model's state dict (the map transformers' GGUF loader uses,
    built once instead of once per module)."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch_id = next(key for key, value in MODEL_ARCH_NAMES.items() if value == arch)
    name_map = get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict():
        base, _, suffix = hf_name.rpartition(".")
        gguf_name = name_map.get_name(base)
        if gguf_name is not None:
            names[f"{gguf_name}.{suffix}"] = hf_name
    return names


def read_state(tensors, path: Path, model) -> dict:
    """The file's tensors by transformers' names: floats as torch tensors (as transformers would load them, in
    float32 for norms and vectors), matrices of READERS' types as gguf_blocks.GGUFMatrix (views of the mapped
    file, read when the kernels pack them)."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    config = model.config
    arch = {"mistral": "llama"}.get(config.model_type, config.model_type)
    processor = TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=config.to_dict())
    names = gguf_names(model, arch)
    state: dict = {}
    dequantized: set[str] = set()
    for tensor in tensors:
        hf_name = names.get(tensor.name)
        if hf_name is None:
            continue
        kind = tensor.tensor_type.name
        raw = np.asarray(tensor.data)
        if kind in READERS and raw.ndim == 2:
            state[hf_name] = GGUFMatrix(kind, raw, _row_order(processor, tensor.name, raw.shape[0]), tensor.name)
            continue
        if kind in FLOAT_TYPES:
            values = np.array(raw)
        else:
            dequantized.add(kind)
            values = dequantize(raw, tensor.tensor_type)
        values = processor.process(values, tensor.name).weights
        shape = tuple(reversed([int(n) for n in tensor.shape]))
        state[hf_name] = torch.from_numpy(np.ascontiguousarray(values)).reshape(shape)
    for kind in sorted(dequantized):
        print(
            f"specdec: {path.name}: {kind} matrices are dequantized to float32 (the kernels do not read {kind})",
            file=sys.stderr,
        )
    missing = [n for n in model.state_dict() if n not in state and not n.endswith("lm_head.weight")]
    if missing:
        raise ModelLoadError(f"{path.name} lacks tensors the model needs, e.g. {missing[0]}")
    return state
