"""Resolves a model name to weights, a tokenizer and an execution backend (chosen by backend_choice.py).

A name is a built-in alias (`smollm2-135m`), a local transformers folder (safetensors only), a GGUF file (its
quantized matrices kept in their formats on the CPU kernels, gguf_model.py, or dequantized to float), or a Hugging
Face hub id where the hub is reachable.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from ..errors import ModelLoadError, first_line
from .backend import CausalLM, ModelInfo
from .backend_choice import check_backend, check_graphs, make_backend
from .devices import check_device_dtype, resolve_device, resolve_dtype
from .registry import KNOWN_MODELS

QUANTIZED_BACKENDS = ("auto", "kernels", "kernels-bf16kv")  # those that run a GGUF file's quantized matrices


@dataclass
class LoadedModel:
    name: str
    hf_model: Any  # transformers PreTrainedModel (its types are partial), kept for baselines and training
    tokenizer: Any  # a transformers tokenizer
    backend: CausalLM

    @property
    def info(self) -> ModelInfo:
        return self.backend.info


def locate(spec: str) -> tuple[str, str | None]:
    """(folder or hub id, gguf file name or None) for a model name; raises ModelLoadError if unusable."""
    if spec in KNOWN_MODELS:
        from .fetch import ensure_known_model

        return str(ensure_known_model(spec)), None
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {spec}")
        return str(path.parent), path.name
    if path.exists():
        if not path.is_dir() or not (path / "config.json").is_file():
            raise ModelLoadError(f"{spec} is not a model folder (no config.json) or a .gguf file")
        return str(path), None
    if spec.count("/") == 1 and not spec.startswith((".", "/", "~")):
        return spec, None  # a hub id
    known = ", ".join(KNOWN_MODELS)
    raise ModelLoadError(
        f"unknown model {spec!r}: not a built-in alias ({known}), a local folder, a .gguf file or a hub id"
    )


def builtin_runs_its_file() -> bool:
    """Whether a built-in alias runs its GGUF file as it is (its quantized matrices on the CPU kernels) rather than
    its float conversion: where the kernels run. Elsewhere (a GPU, transformers, --dequantize) the conversion."""
    from ..kernels import unavailable_reason

    return unavailable_reason() is None


def load_model(
    spec: str,
    device: str = "auto",
    dtype: str = "auto",
    trust_remote_code: bool = False,
    backend: str = "auto",
    slots: int = 1,
    max_context: int | None = None,
    graphs: str = "auto",
    compile: str = "auto",
    dequantize: bool = False,
) -> LoadedModel:
    """Loads weights and tokenizer, and wraps them in the fastest backend that supports the model. max_context:
    sequences (prompt, output and drafts) of at most this many tokens, below the model's own context: the KV pool
    holds that many rows a slot, and info.max_context, which every length check reads, says it. graphs, compile:
    see make_backend. A GGUF file with quantized matrices runs them in their own formats on the CPU kernels
    (gguf_model.py; activations float32, the dtype aside, and the KV cache in bfloat16 as llama.cpp keeps its in
    16 bits, except with backend "kernels": float32) unless `dequantize`, or unless the kernels cannot run it (then
    it is dequantized to `dtype`, as with `dequantize`). A built-in alias is its GGUF file where the kernels run
    (builtin_runs_its_file), else its float conversion."""
    check_device_dtype(device, dtype)
    check_backend(backend)
    check_graphs(graphs, compile)
    dev = resolve_device(device)
    if not dequantize and dev.type == "cpu" and backend in QUANTIZED_BACKENDS:
        quantized = _load_as_file(spec, backend, trust_remote_code, slots, max_context)
        if quantized is not None:
            if dtype != "auto":  # said, not refused: the same command runs a float model in that dtype
                print(
                    f"specdec: {spec} runs its file's quantized matrices; --dtype applies with --dequantize",
                    file=sys.stderr,
                )
            return quantized
    folder, gguf = locate(spec)
    torch_dtype = resolve_dtype(dtype, dev)
    hf_model, tokenizer = _load_transformers(folder, gguf, torch_dtype, trust_remote_code)
    hf_model.to(dev).eval()
    info = model_info(spec, hf_model, tokenizer, dev, torch_dtype)
    if max_context:
        info = replace(info, max_context=min(max_context, info.max_context))
    return LoadedModel(
        name=spec,
        hf_model=hf_model,
        tokenizer=tokenizer,
        backend=make_backend(hf_model, info, backend, slots, max_context, graphs, compile),
    )


def _load_as_file(
    spec: str, backend: str, trust_remote_code: bool, slots: int, max_context: int | None
) -> LoadedModel | None:
    """The model of a GGUF file, or of a built-in alias's file where the kernels run, with its quantized matrices as
    they are; None for any other model, or where the kernels or the file's architecture do not allow it."""
    if spec in KNOWN_MODELS:
        if not builtin_runs_its_file():
            return None
        from .fetch import ensure_gguf

        path = ensure_gguf(spec)
    else:
        folder, gguf = locate(spec)
        if not gguf:
            return None
        path = Path(folder) / gguf
    return _load_quantized_gguf(spec, path, trust_remote_code, slots, max_context, bf16_cache=backend != "kernels")


def _load_quantized_gguf(
    spec: str, path: Path, trust_remote_code: bool, slots: int, max_context: int | None, bf16_cache: bool = False
) -> LoadedModel | None:
    """A GGUF file's model on the CPU kernels with its quantized matrices as they are, or None where the kernels or
    the file's architecture do not allow it (then it loads dequantized)."""
    from ..kernels import unavailable_reason
    from . import gguf_index
    from .family import fast_path_problem
    from .gguf_model import architecture_problem, read_state, release_freed_memory, skeleton
    from .kernel_args import four_bit_problem
    from .kernel_llama import KernelLlama

    _quiet_transformers()
    made = _gguf_metadata(path, trust_remote_code)
    if made is None:
        return None  # a float file: transformers loads it as it is
    config, tokenizer, tensors, parsed = made
    problem = (
        unavailable_reason() or fast_path_problem(config) or four_bit_problem(config) or architecture_problem(config)
    )
    if problem:
        print(f"specdec: {path.name} is dequantized to float: {problem}", file=sys.stderr)
        return None
    if parsed:  # kept for the next load of the file; a file the kernels do not run is not (it loads dequantized)
        gguf_index.store(path, config, tokenizer, tensors)
    hf_model = skeleton(config)
    state = read_state(tensors, path, hf_model)
    info = model_info(spec, hf_model, tokenizer, torch.device("cpu"), torch.float32)
    if max_context:
        info = replace(info, max_context=min(max_context, info.max_context))
    try:
        backend = KernelLlama(hf_model, info, slots=slots, max_context=max_context, state=state, bf16_cache=bf16_cache)
    except ValueError as exc:  # a scale that is not finite, found as the matrix is packed
        raise ModelLoadError(f"{path.name}: {first_line(exc)}") from None
    del state, tensors
    release_freed_memory()
    return LoadedModel(name=spec, hf_model=hf_model, tokenizer=tokenizer, backend=backend)


def _gguf_metadata(path: Path, trust_remote_code: bool) -> tuple[Any, Any, list, bool] | None:
    """(config, tokenizer, tensors, parsed) of a GGUF file with quantized matrices, from specdec's cache where an
    earlier load of the same file left them (gguf_index.py; parsed False), else parsed by the gguf package's reader
    and converted by transformers (parsed True); None for a float file."""
    from transformers import AutoConfig, AutoTokenizer

    from . import gguf_index
    from .gguf_model import drop_parsed_metadata, open_gguf, quantized_matrix_types

    cached = gguf_index.load_cached(path)
    if cached is not None:
        return cached.config, cached.tokenizer, cached.tensors, False
    with gguf_parsing(path.name):
        reader = open_gguf(path)
        if not quantized_matrix_types(reader.tensors):
            return None
        kwargs = {"trust_remote_code": trust_remote_code, "gguf_file": path.name}
        try:
            config = AutoConfig.from_pretrained(str(path.parent), **kwargs)
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
        except (OSError, ValueError, ImportError, KeyError) as exc:
            raise _load_error(str(path.parent), path.name, exc) from None
    drop_parsed_metadata(reader)
    return config, tokenizer, reader.tensors, True


def load_tokenizer(spec: str, trust_remote_code: bool = False) -> tuple[Any, int]:
    """(tokenizer, vocabulary size of the model's output layer) for a model name, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer

    folder, gguf = locate(spec)
    _quiet_transformers()
    kwargs = {"trust_remote_code": trust_remote_code, **({"gguf_file": gguf} if gguf else {})}
    try:
        with gguf_parsing(gguf):
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            config = AutoConfig.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _load_error(folder, gguf, exc) from None
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    if not vocab_size:
        raise ModelLoadError(f"cannot read the vocabulary size of {spec} from its config")
    return tokenizer, int(vocab_size)


def gguf_parsing(gguf: str | None):
    """fast_gguf_parsing() where a GGUF file is read, else nothing (gguf_parsing.py)."""
    from contextlib import nullcontext

    if not gguf:
        return nullcontext()
    from .gguf_parsing import fast_gguf_parsing

    return fast_gguf_parsing()


def _quiet_transformers() -> None:
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    try:
        from huggingface_hub.utils import logging as hub_logging

        hub_logging.set_verbosity_error()
    except ImportError:
        pass


def _load_error(folder: str, gguf: str | None, exc: Exception) -> ModelLoadError:
    first = first_line(exc)
    hint = ""
    if not Path(folder).exists() and not os.environ.get("HF_HUB_OFFLINE"):
        hint = " (the Hugging Face hub may be unreachable: pass a local folder or a .gguf file)"
    return ModelLoadError(f"cannot load {folder if not gguf else Path(folder) / gguf}: {first}{hint}")


def _load_transformers(folder: str, gguf: str | None, dtype: torch.dtype, trust_remote_code: bool):
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _quiet_transformers()
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code}
    if gguf:
        kwargs["gguf_file"] = gguf
    try:
        with gguf_parsing(gguf):
            tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
            if not gguf:
                kwargs["use_safetensors"] = True  # never unpickle weights
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    except (OSError, ValueError, ImportError, KeyError, SafetensorError) as exc:  # SafetensorError: a damaged file
        raise _load_error(folder, gguf, exc) from None
    if gguf and getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None  # type: ignore[assignment]  # GGUF weights arrive dequantized
    return model, tokenizer


def model_info(name: str, model, tokenizer, device: torch.device, dtype: torch.dtype) -> ModelInfo:
    cfg = model.config
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = tuple(e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None)
    return ModelInfo(
        name=name,
        model_type=cfg.model_type,
        vocab_size=model.get_output_embeddings().weight.shape[0],
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_hidden_layers,
        max_context=getattr(cfg, "max_position_embeddings", 4096),
        eos_token_ids=eos_ids,
        device=device,
        dtype=dtype,
    )
