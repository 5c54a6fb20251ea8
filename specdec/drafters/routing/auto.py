"""The drafter `auto` builds for a target (what was given, else what pays where the target runs), and what it reads:
the heads shipped with specdec (bundled_head) and whether the target's 4-bit copy can draft (quantized_copy_problem).

- A draft model, an EAGLE head or Medusa heads given by the caller: that drafter.
- The CPU kernels running the target (and able to hold a 4-bit copy of it): `quantized`, the target's own copy,
  measured against prompt lookup and the shipped EAGLE head there (docs/drafters.md).
- Elsewhere (the torch backend, e.g. on a GPU) with an EAGLE head shipped for the model: the select drafter over
  that head and prompt lookup (AUTO_SELECT). Which of them pays depends on the device: on a GPU a pass over many
  tokens costs about what a pass over one does, and a head drafts at the speed of its kernel launches. So instead of
  a fixed preference, the selector drafts each step with the candidate whose measured yield (tokens emitted per
  second, under the verify-cost curve the engine measures on that device at load) is the highest, or with none
  where plain decoding is expected to be faster (drafters/select.py).
- Else `ngram` (prompt lookup).
"""

from __future__ import annotations

AUTO_SELECT = ("eagle", "ngram")  # the candidates auto's selector measures, where a head is shipped


def auto_drafter(target, options: dict) -> tuple[str, dict]:
    """(name, options) of the drafter `auto` stands for on the LoadedModel `target`, given the drafter options
    (those of the select drafter it builds name its candidates, AUTO_SELECT)."""
    name = auto_drafter_name(target, options)
    return name, ({**options, "select_from": AUTO_SELECT} if name == "select" else options)


def auto_drafter_name(target, options: dict) -> str:
    """The drafter's name (see the module's docstring)."""
    if options.get("draft_model"):
        return "draft-model"
    if options.get("eagle_head"):
        return "eagle"
    if options.get("medusa_head"):
        return "medusa"
    if quantized_copy_problem(target) is None:
        return "quantized"
    if not on_cpu_kernels(target) and bundled_head(target.name) is not None:
        return "select"
    return "ngram"


def on_cpu_kernels(target) -> bool:
    """Whether the CPU kernels run the target (where auto's choice is the quantized copy, or prompt lookup)."""
    from ...models.kernel_llama import KernelLlama

    return isinstance(target.backend, KernelLlama)


def quantized_copy_problem(target) -> str | None:
    """Why the quantized drafter cannot run for this LoadedModel, or None."""
    from ...models.kernel_args import four_bit_problem
    from ...models.kernel_llama import KernelLlama

    if not isinstance(target.backend, KernelLlama):
        return (
            "the quantized drafter runs on the CPU kernels (backend kernels, a Llama-family model on a CPU with "
            "AVX2 or AVX-512)"
        )
    if target.backend.quantized_weights:
        return (
            f"the quantized drafter copies float weights, and {target.name!r} runs its file's quantized ones "
            "(pass --dequantize to run them as floats)"
        )
    problem = four_bit_problem(target.hf_model.config)
    return f"the quantized drafter cannot hold a 4-bit copy of {target.name!r}: {problem}" if problem else None


def bundled_head(model_name: str, kind: str = "eagle"):
    """The folder of the EAGLE head (kind "eagle"), EAGLE-3 head ("eagle3") or Medusa heads ("medusa") shipped with
    specdec for a built-in model, or None."""
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "assets" / "heads" / model_name  # specdec/assets
    if kind == "medusa":
        folder, weights = folder / "medusa", "medusa_heads.safetensors"
    elif kind == "eagle3":
        folder, weights = folder / "eagle3", "model.safetensors"
    else:
        weights = "eagle_head.safetensors"
    return folder if (folder / weights).is_file() else None
