"""The resident memory a model's load adds to the process, as bench-shape reports it for a GGUF file.

Measured as the process's resident set (Linux `/proc/self/status`) before and after the load, freed heap pages
handed back first each time (gguf_model.release_freed_memory). The code the load runs is imported before the first
reading (the family's transformers model class, the GGUF tokenizer converters, the kernels), so that what is
counted is the model: its packed matrices, norms, RoPE tables, tokenizer and config. The KV cache is allocated
but not yet written, so none of it is resident.
"""

from __future__ import annotations

import importlib


def resident_bytes() -> int | None:
    """This process's resident memory in bytes after freed heap pages are handed back; None off Linux."""
    from ..models.gguf_model import release_freed_memory

    release_freed_memory()
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def import_load_code(config_class: str) -> None:
    """Imports what loading a GGUF file of this transformers config class runs, without loading anything."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from ..kernels import load

    model_type = getattr(transformers, config_class).model_type
    getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    for module in (
        "gguf",
        "transformers.integrations.ggml",
        "transformers.modeling_gguf_pytorch_utils",
        "transformers.convert_slow_tokenizer",
        "transformers.models.auto.tokenization_auto",
    ):
        importlib.import_module(module)
    load()


def load_footprint(before: int | None, after: int | None, file_bytes: int, max_context: int) -> dict:
    """The bench JSON's memory entry from the resident bytes read around a load of max_context positions."""
    if before is None or after is None:
        return {"resident_bytes_added_by_load": None, "over_file_bytes": None}
    added = after - before
    return {
        "resident_bytes_added_by_load": added,
        "over_file_bytes": added / file_bytes,
        "max_context": max_context,
        "measured": "resident set before and after the load, its code imported first; RoPE tables for "
        "max_context positions; the KV cache allocated but not yet written",
    }
