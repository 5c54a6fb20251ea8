"""Which backend runs a loaded model (--backend, --graphs, --compile): specdec's CPU kernels, its torch forward
(with CUDA graphs and torch.compile), or transformers' own forward, and the checks of those choices."""

from __future__ import annotations

import sys
from dataclasses import replace

import torch

from ..config import BACKENDS, COMPILE, GRAPHS
from ..errors import ConfigError
from .backend import CausalLM, HFBackend, ModelInfo


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


def make_backend(
    hf_model,
    info: ModelInfo,
    backend: str = "auto",
    slots: int = 1,
    max_context: int | None = None,
    graphs: str = "auto",
    compile: str = "auto",
) -> CausalLM:
    """kernels: specdec's CPU kernels (batch-invariant, float32 compute; with bfloat16 weights and AVX-512 BF16,
    bfloat16 products for each prompt's prefill); kernels-fp32: the same with float32 products in every pass;
    kernels-bf16kv: the same as kernels with the KV cache in bfloat16 (bfloat16 weights only; a quantized
    GGUF file's kernels, loading.py, keep it so under auto too);
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
            raise ConfigError(
                f"--{option} on needs the torch backend (--backend torch), not {type(backend_made).__name__}"
            )
    return backend_made


def _make_backend(
    hf_model, info: ModelInfo, backend: str, slots: int, max_context: int | None, graphs: str, compile: bool
) -> CausalLM:
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
        if problem and backend != "hf":
            print(fallback_line(hf_model.config, problem), file=sys.stderr)
        return HFBackend(hf_model, info)
    limit = family_of(hf_model.config).context_limit
    if limit and limit < info.max_context:  # past it LongRoPE's frequencies change: the fast paths stop there
        info = replace(info, max_context=limit)
        max_context = min(max_context or limit, limit)
    if backend == "kernels" or (backend == "auto" and info.device.type == "cpu"):
        from ..kernels import KernelUnavailable, unavailable_reason

        from .kernel_args import kernel_shape_problem
        from .kernel_llama import KernelLlama

        reason = unavailable_reason() if info.device.type == "cpu" else "the CPU kernels run on the CPU only"
        reason = reason or kernel_shape_problem(hf_model.config)
        if reason is None:
            try:
                return KernelLlama(
                    hf_model,
                    info,
                    slots=slots,
                    max_context=max_context,
                    bf16_products=bf16_products,
                    bf16_prefill=bf16_prefill,
                    bf16_cache=bf16_cache,
                )
            except KernelUnavailable as exc:
                reason = str(exc)
                if backend == "auto":
                    print(f"specdec: {reason}; using the torch backend", file=sys.stderr)
        if backend == "kernels":
            raise ConfigError(f"the kernels backend is unavailable: {reason}")
    return FastLlama(hf_model, info, slots=slots, max_context=max_context, graphs=graphs, compile=compile)


def fallback_line(config, problem: str) -> str:
    """The one line that says a model runs on transformers' forward, and what the fast paths lack for it."""
    return (
        f"specdec: {config.model_type} runs on the hf backend (transformers' own forward, several times slower, "
        f"no quantized drafter): the fast paths do not support {problem}"
    )
