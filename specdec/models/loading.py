"""Resolves a model name to weights, a tokenizer and an execution backend.

A name is a built-in alias (`smollm2-135m`), a local transformers folder (safetensors only), a
GGUF file (dequantized to float), or a Hugging Face hub id where the hub is reachable.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..config import BACKENDS, COMPILE, GRAPHS, check_device_dtype
from ..errors import ConfigError, ModelLoadError, first_line
from .backend import CausalLM, HFBackend, ModelInfo
from .registry import KNOWN_MODELS


@dataclass
class LoadedModel:
    name: str
    hf_model: object  # transformers PreTrainedModel, kept for baselines and training
    tokenizer: object
    backend: CausalLM

    @property
    def info(self) -> ModelInfo:
        return self.backend.info


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was asked for, but torch sees no CUDA GPU")
    return torch.device(device)


def cpu_has_bf16() -> bool:
    """True where the CPU computes bfloat16 natively (AVX-512 BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """'auto' is bfloat16 on GPUs and CPUs that compute it natively, else float32."""
    if dtype == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.bfloat16 if cpu_has_bf16() else torch.float32
    return getattr(torch, dtype)


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
    raise ModelLoadError(f"unknown model {spec!r}: not a built-in alias ({known}), a local folder, a .gguf file or a hub id")


def load_model(spec: str, device: str = "auto", dtype: str = "auto", trust_remote_code: bool = False,
               backend: str = "auto", slots: int = 1, max_context: int | None = None,
               graphs: str = "auto", compile: str = "auto", dequantize: bool = False) -> LoadedModel:
    """Loads weights and tokenizer, and wraps them in the fastest backend that supports the model. max_context:
    sequences (prompt, output and drafts) of at most this many tokens, below the model's own context: the KV pool
    holds that many rows a slot, and info.max_context, which every length check reads, says it. graphs, compile:
    see make_backend. A GGUF file with quantized matrices runs them in their own formats on the CPU kernels
    (gguf_model.py; activations float32, the dtype aside) unless `dequantize`, or unless the kernels cannot run it
    (then it is dequantized to `dtype`, as with `dequantize`)."""
    check_device_dtype(device, dtype)
    check_backend(backend)
    check_graphs(graphs, compile)
    folder, gguf = locate(spec)
    dev = resolve_device(device)
    if gguf and not dequantize and dev.type == "cpu" and backend in ("auto", "kernels"):
        quantized = _load_quantized_gguf(spec, Path(folder) / gguf, trust_remote_code, slots, max_context)
        if quantized is not None:
            return quantized
    torch_dtype = resolve_dtype(dtype, dev)
    hf_model, tokenizer = _load_transformers(folder, gguf, torch_dtype, trust_remote_code)
    hf_model.to(dev).eval()
    info = model_info(spec, hf_model, tokenizer, dev, torch_dtype)
    if max_context:
        info = replace(info, max_context=min(max_context, info.max_context))
    return LoadedModel(name=spec, hf_model=hf_model, tokenizer=tokenizer,
                       backend=make_backend(hf_model, info, backend, slots, max_context, graphs, compile))


def _load_quantized_gguf(spec: str, path: Path, trust_remote_code: bool, slots: int,
                         max_context: int | None) -> LoadedModel | None:
    """A GGUF file's model on the CPU kernels with its quantized matrices as they are, or None where the kernels or
    the file's architecture do not allow it (then it loads dequantized)."""
    from transformers import AutoConfig, AutoTokenizer

    from ..kernels import unavailable_reason
    from .family import fast_path_problem
    from .gguf_model import quantized_gguf_problem, read_state, release_freed_memory, skeleton
    from .kernel_llama import KernelLlama, four_bit_problem

    _quiet_transformers()
    kwargs = {"trust_remote_code": trust_remote_code, "gguf_file": path.name}
    try:
        config = AutoConfig.from_pretrained(str(path.parent), **kwargs)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _load_error(str(path.parent), path.name, exc) from None
    problem = (unavailable_reason() or fast_path_problem(config) or four_bit_problem(config)
               or quantized_gguf_problem(path, config))
    if problem:
        if "no quantized matrices" not in problem:
            print(f"specdec: {path.name} is dequantized to float: {problem}", file=sys.stderr)
        return None
    hf_model = skeleton(config)
    state = read_state(path, hf_model)
    info = model_info(spec, hf_model, tokenizer, torch.device("cpu"), torch.float32)
    if max_context:
        info = replace(info, max_context=min(max_context, info.max_context))
    try:
        backend = KernelLlama(hf_model, info, slots=slots, max_context=max_context, state=state)
    except ValueError as exc:  # a scale that is not finite, found as the matrix is packed
        raise ModelLoadError(f"{path.name}: {first_line(exc)}") from None
    del state
    release_freed_memory()
    return LoadedModel(name=spec, hf_model=hf_model, tokenizer=tokenizer, backend=backend)


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")


def check_graphs(graphs: str, compile: str = "auto") -> None:
    if graphs not in GRAPHS:
        raise ConfigError(f"graphs must be one of {', '.join(GRAPHS)}, got {graphs!r}")
    if compile not in COMPILE:
        raise ConfigError(f"compile must be one of {', '.join(COMPILE)}, got {compile!r}")


def graph_mode(graphs: str, device: torch.device) -> str:
    """FastLlama's graph mode for a --graphs choice: auto is captured graphs on CUDA and off elsewhere; on is
    captured on CUDA and the same shape-static passes uncaptured elsewhere."""
    if graphs == "off" or (graphs == "auto" and device.type != "cuda"):
        return "off"
    return "cuda" if device.type == "cuda" else "eager"


def compile_mode(compile: str, graph_mode: str) -> bool:
    """Whether FastLlama compiles its shape-static passes (models/compiled_pass.py) for a --compile choice, given
    its graph mode: on compiles the passes wherever they run (captured on a GPU, uncaptured on the CPU), and needs
    them; off never; auto is off until a GPU measurement shows that compiling pays (docs/cuda.md: it compiles each
    bucket at its first use, which costs seconds per bucket)."""
    if compile == "on" and graph_mode == "off":
        raise ConfigError("--compile on compiles the shape-static passes: it needs --graphs on (or auto on a CUDA GPU)")
    if compile == "on" and graph_mode == "eager":
        from .compiled_pass import inductor_problem

        problem = inductor_problem()
        if problem:
            raise ConfigError(f"--compile on: {problem}")
    return compile == "on"


def make_backend(hf_model, info: ModelInfo, backend: str = "auto", slots: int = 1,
                 max_context: int | None = None, graphs: str = "auto", compile: str = "auto") -> CausalLM:
    """kernels: specdec's CPU kernels (batch-invariant, float32 compute; with bfloat16 weights and AVX-512 BF16,
    bfloat16 products for each prompt's prefill); kernels-fp32: the same with float32 products in every pass;
    kernels-bf16kv: the same as kernels with the KV cache in bfloat16 (bfloat16 weights only);
    kernels-bf16: bfloat16 products in every pass (activations rounded to bfloat16 at each matrix product's input;
    faster, less exact, still batch-invariant); torch: specdec's Llama forward in torch (bit-identical to transformers); hf:
    transformers' own forward. auto: the first that fits.
    graphs (GRAPHS): the torch backend's decode and verify passes as CUDA graphs (docs/cuda.md); auto: on CUDA only;
    on: also on a CPU, as the same shape-static passes uncaptured; a backend other than torch refuses on.
    compile (COMPILE): those passes compiled by torch.compile before capture (compile_mode; docs/cuda.md)."""
    check_graphs(graphs, compile)
    mode = graph_mode(graphs, info.device)
    compiled = compile_mode(compile, mode)
    backend_made = _make_backend(hf_model, info, backend, slots, max_context, mode, compiled)
    for option, value in (("graphs", graphs), ("compile", compile)):
        if value == "on" and backend_made.pass_graphs is None:
            raise ConfigError(f"--{option} on needs the torch backend (--backend torch), not "
                              f"{type(backend_made).__name__}")
    return backend_made


def _make_backend(hf_model, info: ModelInfo, backend: str, slots: int, max_context: int | None,
                  graphs: str, compile: bool) -> CausalLM:
    from .family import family_of, fast_path_problem
    from .llama import FastLlama

    check_backend(backend)
    problem = fast_path_problem(hf_model.config)
    bf16_products = backend == "kernels-bf16"  # the kernels, with bfloat16 products (KernelLlama checks they can)
    bf16_prefill = None if backend in ("auto", "kernels", "kernels-bf16kv") else False
    bf16_cache = backend == "kernels-bf16kv"
    if backend.startswith("kernels"):
        backend = "kernels"
    if backend in ("kernels", "torch") and problem:
        raise ConfigError(f"the {backend} backend does not support this model: {problem}")
    if backend == "hf" or problem:
        if backend != "hf":
            print(fallback_line(hf_model.config, problem), file=sys.stderr)
        return HFBackend(hf_model, info)
    limit = family_of(hf_model.config).context_limit
    if limit and limit < info.max_context:  # past it LongRoPE's frequencies change: the fast paths stop there
        info = replace(info, max_context=limit)
        max_context = min(max_context or limit, limit)
    if backend == "kernels" or (backend == "auto" and info.device.type == "cpu"):
        from ..kernels import KernelUnavailable, unavailable_reason

        from .kernel_llama import KernelLlama, kernel_shape_problem

        reason = unavailable_reason() if info.device.type == "cpu" else "the CPU kernels run on the CPU only"
        reason = reason or kernel_shape_problem(hf_model.config)
        if reason is None:
            try:
                return KernelLlama(hf_model, info, slots=slots, max_context=max_context, bf16_products=bf16_products,
                                   bf16_prefill=bf16_prefill, bf16_cache=bf16_cache)
            except KernelUnavailable as exc:
                reason = str(exc)
                if backend == "auto":
                    print(f"specdec: {reason}; using the torch backend", file=sys.stderr)
        if backend == "kernels":
            raise ConfigError(f"the kernels backend is unavailable: {reason}")
    return FastLlama(hf_model, info, slots=slots, max_context=max_context, graphs=graphs, compile=compile)


def fallback_line(config, problem: str) -> str:
    """The one line that says a model runs on transformers' forward, and what the fast paths lack for it."""
    return (f"specdec: {config.model_type} runs on the hf backend (transformers' own forward, several times slower, "
            f"no quantized drafter): the fast paths do not support {problem}")


def load_tokenizer(spec: str, trust_remote_code: bool = False) -> tuple[object, int]:
    """(tokenizer, vocabulary size of the model's output layer) for a model name, without loading its weights."""
    from transformers import AutoConfig, AutoTokenizer

    folder, gguf = locate(spec)
    _quiet_transformers()
    kwargs = {"trust_remote_code": trust_remote_code, **({"gguf_file": gguf} if gguf else {})}
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        config = AutoConfig.from_pretrained(folder, **kwargs)
    except (OSError, ValueError, ImportError, KeyError) as exc:
        raise _load_error(folder, gguf, exc) from None
    vocab_size = getattr(config.get_text_config(), "vocab_size", None)
    if not vocab_size:
        raise ModelLoadError(f"cannot read the vocabulary size of {spec} from its config")
    return tokenizer, int(vocab_size)


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
    kwargs = {"trust_remote_code": trust_remote_code}
    if gguf:
        kwargs["gguf_file"] = gguf
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        if not gguf:
            kwargs["use_safetensors"] = True  # never unpickle weights
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, **kwargs)
    except (OSError, ValueError, ImportError, KeyError, SafetensorError) as exc:  # SafetensorError: a damaged file
        raise _load_error(folder, gguf, exc) from None
    if gguf and getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None  # GGUF weights arrive dequantized
    return model, tokenizer


def model_info(name: str, model, tokenizer, device: torch.device, dtype: torch.dtype) -> ModelInfo:
    cfg = model.config
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = tuple(e for e in (eos if isinstance(eos, (list, tuple)) else [eos]) if e is not None)
    return ModelInfo(name=name, model_type=cfg.model_type, vocab_size=model.get_output_embeddings().weight.shape[0],
                     hidden_size=cfg.hidden_size, num_layers=cfg.num_hidden_layers,
                     max_context=getattr(cfg, "max_position_embeddings", 4096), eos_token_ids=eos_ids,
                     device=device, dtype=dtype)
