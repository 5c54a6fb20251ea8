"""specdec: lossless speculative decoding for Hugging Face causal language models.

    from specdec import SpecDecoder
    decoder = SpecDecoder.load("smollm2-135m", drafter="ngram")
    print(decoder.generate("Write a haiku about the sea.", max_new_tokens=64).text)

Imports are lazy so that `import specdec` stays light.
"""

from __future__ import annotations

__version__ = "0.1.0"

_EXPORTS = {
    "SpecDecoder": ".engine",
    "GenerationResult": ".stream_core",
    "TextStream": ".stream_core",
    "DrafterChoice": ".choice",
    "OWN_DRAFTER": ".choice",
    "PLAIN": ".choice",
    "GenerationConfig": ".config",
    "SamplingConfig": ".config",
    "SpeculationConfig": ".speculation_config",
    "GenerationMetrics": ".metrics",
    "SpecdecError": ".errors",
    "load_model": ".models.loading",
    "create_drafter": ".drafters",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module 'specdec' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
