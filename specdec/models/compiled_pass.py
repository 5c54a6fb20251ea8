"""The shape-static pass's steps compiled by torch.compile (inductor), before pass_graphs.py captures the pass as a
CUDA graph: inductor fuses each step's small operations (RMSNorm's square, mean, rsqrt and scale; RoPE's halves;
the residual adds; SiLU times up; the attention masks) into a few kernels, where the eager steps launch one kernel
per operation (about 40 per layer on a GPU). Matrix products stay the library's (cuBLAS, oneDNN).

- What is compiled: the pass's prologue (embedding, masks, RoPE angles), each layer's input step (norm, q/k/v
  projections, q/k norms, RoPE: FastLlama._qkv) and output step (output projection, residual, norm, MLP, residual:
  FastLlama._finish_layer), and the epilogue (final norm, LM head). The KV writes, the key window's gather and
  attention stay eager (static_pass.py).
- Static shapes (dynamic=False): each step is compiled once per bucket (B, T) and kind of layer, the prologue also
  per key window. Layers of one kind share one compiled graph (their weights are its inputs, not constants), and
  the layer steps do not depend on the key window, so a longer window compiles only the prologue. A later pass of
  the same bucket and window compiles nothing (tests/test_compiled_pass.py checks dynamo's counters).
- There are more cache entries per compiled function than dynamo's default recompile limit (8 per function): the
  steps run under a raised limit (scope), which applies to them alone.
- No CUDA graphs of inductor's own (the default mode): pass_graphs.py captures the whole pass itself. Explicit casts
  round as in eager mode (emulate_precision_casts), so bfloat16 passes keep the eager pass's roundings.
- Compilation happens at a step's first call: on a GPU in the warm-up before each capture, never inside it.
"""

from __future__ import annotations

import functools

import torch

from .static_pass import PassSteps, epilogue, layer_in, layer_out, prologue

# cache entries a compiled step may hold: buckets (35) x key windows (up to ~10) x kinds of layer, with room
RECOMPILE_LIMIT = 1024
COMPILE_OPTIONS = {"emulate_precision_casts": True}


def inductor_problem() -> str | None:
    """Why torch.compile cannot compile here (no C++ compiler on the CPU, no inductor), or None where it can."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler

        get_cpp_compiler()
    except Exception as exc:  # noqa: BLE001 - any failure to find a compiler means the same: no inductor here
        return f"torch.compile cannot compile for the CPU here: {exc}"
    return None


@functools.cache
def compiled_steps() -> PassSteps:
    """The pass's steps, each wrapped by torch.compile (compiled at first call, per shape); shared by every model."""

    def compiled(step):
        return torch.compile(step, dynamic=False, fullgraph=True, options=COMPILE_OPTIONS)

    return PassSteps(
        prologue=compiled(prologue),
        layer_in=compiled(layer_in),
        layer_out=compiled(layer_out),
        epilogue=compiled(epilogue),
        scope=_raised_recompile_limit,
    )


def _raised_recompile_limit():
    return torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT, accumulated_recompile_limit=RECOMPILE_LIMIT)
