"""The resident memory a model's load adds to the process, as bench-shape reports it for a GGUF file.

Measured as the process's resident set (Linux `/proc/self/status`) before and after the load, freed heap pages
handed back first each time (gguf_model.release_freed_memory). The code the load runs is imported before the first
reading (the family's transformers model class, the GGUF tokenizer converters, the kernels), so that what is
counted is the model: its packed matrices, norms, RoPE tables, tokenizer and config. The KV cache is allocated
but not yet written, so none of it is resident.

The resident set is reported whole and in its two parts: the process's own memory (anonymous pages: the model)
and pages of files (the libraries' code a first load runs for the first time, about 13 MB of libtorch and
tokenizers: shared, clean and not the model's; a second load adds none).
"""

from __future__ import annotations

import importlib


def resident_bytes() -> dict[str, int] | None:
    """This process's resident memory in bytes after freed heap pages are handed back: `total` (VmRSS), `own`
    (RssAnon: anonymous pages) and `files` (RssFile: mapped files' pages, the libraries' code among them); None
    off Linux."""
    from ..models.gguf_model import release_freed_memory

    release_freed_memory()
    fields = {"VmRSS:": "total", "RssAnon:": "own", "RssFile:": "files"}
    found = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                parts = line.split()
                if parts and parts[0] in fields:
                    found[fields[parts[0]]] = int(parts[1]) * 1024
    except OSError:
        return None
    return found if len(found) == len(fields) else None


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


def load_footprint(
    before: dict[str, int] | None, after: dict[str, int] | None, file_bytes: int, max_context: int
) -> dict:
    """The bench JSON's memory entry from the resident bytes (resident_bytes) read around a load of max_context
    positions."""
    if before is None or after is None:
        return {"resident_bytes_added_by_load": None, "over_file_bytes": None}
    added = after["total"] - before["total"]
    own = after["own"] - before["own"]
    return {
        "resident_bytes_added_by_load": added,
        "over_file_bytes": added / file_bytes,
        "own_bytes_added_by_load": own,
        "own_over_file_bytes": own / file_bytes,
        "library_bytes_added_by_load": after["files"] - before["files"],
        "max_context": max_context,
        "measured": "resident set before and after the load, its code imported first; own: anonymous pages, "
        "library: pages of mapped files (code a first load runs); RoPE tables for max_context positions; the KV "
        "cache allocated but not yet written",
    }
