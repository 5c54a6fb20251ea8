"""`specdec bench-shape --quant`: a shape's random weights as a GGUF file in one of llama.cpp's formats, run in
those formats on specdec's CPU kernels and, with `--llama-cpp DIR`, by llama-bench on the very same file.

The file is written once per (shape, format, seed) into specdec's cache (`shapes/`) by bench/gguf_file.py, from
the same float32 weights that bench-shape draws for the float shape with that seed, and reused afterwards. What a
decoding step reads is counted from the file itself: every tensor's bytes (the packed blocks of the matrices, the
float32 norms), of an embedding table that is not also the output layer a row alone. specdec's kernels keep the
file's blocks as they are (models/gguf_model.py) and never screen a quantized head, so these are the bytes its
step reads; llama.cpp may repack some blocks at load (Q4_0 into interleaved rows on AVX2), of the same size.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ConfigError
from ..files import cache_root, write_atomic

if TYPE_CHECKING:  # torch and numpy load when a shape is measured: the CLI lists --quant's choices without them
    import torch

QUANTS = ("Q8_0", "Q4_0", "Q4_1", "Q4_K_M", "Q5_K_M")  # gguf_file.QUANTS less F32: --quant's choices
HF_SKIPPED = (
    "transformers' generate cannot run the file's quantized matrices; on a dequantized copy it would time "
    "float decoding, not these formats, and for 1B shapes it takes minutes a run: not run"
)


def shape_gguf_path(name: str, quant: str, seed: int) -> Path:
    """Where the shape's file of format `quant` drawn from `seed` is kept."""
    return cache_root() / "shapes" / f"{name}-{quant}-seed{seed}.gguf"


def ensure_shape_gguf(name: str, quant: str, seed: int, progress=None) -> tuple[Path, bool]:
    """(the file, whether it was written now): an existing file of the same name is reused; otherwise the shape's
    weights are drawn in float32 on the CPU (build_shape_model, as bench-shape draws them) and written under a
    temporary name, then renamed, so that an interrupted write leaves no half file behind."""
    import torch

    from ..models.shapes import build_shape_model
    from .gguf_file import write_gguf_model

    path = shape_gguf_path(name, quant, seed)
    if path.is_file():
        return path, False
    path.parent.mkdir(parents=True, exist_ok=True)
    if progress:
        progress(f"bench-shape: writing {path} (once)")
    model = build_shape_model(name, torch.device("cpu"), torch.float32, seed)
    write_atomic(path, partial(write_gguf_model, model, quant=quant))
    del model
    gc.collect()
    return path, True


@dataclass(frozen=True)
class FileWeights:
    """What a GGUF file holds, from its tensors' headers (nothing is dequantized)."""

    parameters: int  # weights, a tied embedding once (the file has no output.weight then)
    tensor_bytes: int  # all tensors' data
    bytes_read_per_token: int  # tensor_bytes, less an untied embedding table but one row of it
    tied: bool
    bytes_by_type: dict[str, int]  # GGML type -> bytes of the tensors of that type


def file_weights(path: Path) -> FileWeights:
    """The figures of FileWeights for the GGUF file at `path`."""
    from gguf import GGUFReader

    tensors = {t.name: t for t in GGUFReader(str(path)).tensors}
    total = sum(int(t.n_bytes) for t in tensors.values())
    by_type: dict[str, int] = {}
    for t in tensors.values():
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    tied = "output.weight" not in tensors
    per_token = total
    if not tied:  # a step looks one row up: the embedding's rows are its last dimension in GGUF's order
        embed = tensors["token_embd.weight"]
        rows = int(embed.shape[-1])
        per_token -= int(embed.n_bytes) - int(embed.n_bytes) // rows
    return FileWeights(
        sum(int(t.n_elements) for t in tensors.values()), total, per_token, tied, dict(sorted(by_type.items()))
    )


def check_quant(names: list[str], settings, device: torch.device) -> None:
    """One-line refusals, before anything is built, of what --quant cannot run: another device, backend or dtype,
    no kernels, a family the GGUF writer does not write; and of a --llama-cpp folder without llama-bench."""
    from ..kernels import unavailable_reason
    from ..models.shapes import shape_config
    from .gguf_file import ARCHES

    if device.type != "cpu":
        raise ConfigError(
            f"--quant runs the file's formats on specdec's CPU kernels, not on {device}: pass --device cpu"
        )
    if settings.backend not in ("auto", "kernels"):
        raise ConfigError(f"--quant runs on the kernels backend, not {settings.backend}")
    if settings.dtype not in ("auto", "float32"):
        raise ConfigError(
            f"--quant multiplies the file's blocks with float32 activations: --dtype {settings.dtype} does not apply"
        )
    problem = unavailable_reason()
    if problem:
        raise ConfigError(f"--quant needs specdec's CPU kernels: {problem}")
    for name in names:
        model_type = shape_config(name).model_type
        if model_type not in ARCHES:
            raise ConfigError(
                f"--quant: the {name} shape ({model_type}) cannot be written as a GGUF file; the "
                f"writer takes {', '.join(ARCHES)}"
            )
    if settings.llama_cpp:
        from .llama_bench import TOOL
        from .llamacpp import find_tool

        find_tool(settings.llama_cpp, TOOL)


def bench_quantized(name: str, settings, bandwidth: float | None, progress=None) -> dict:
    """One shape's bench-shape entry on its GGUF file of format settings.quant: specdec's plain decoding and
    passes on the kernels, the file's figures, and with settings.llama_cpp llama-bench's right after (the
    specdec model freed first, so that both start from the same free memory)."""
    import torch

    from ..costs import measure_verify_costs
    from ..models.loading import load_model
    from ..models.shapes import ShapeModel, get_shape
    from .resident import import_load_code, load_footprint, resident_bytes
    from .shape_speed import bound_figures, decode_speeds, passes_run

    path, written = ensure_shape_gguf(name, settings.quant, settings.seed, progress)
    weights = file_weights(path)
    import_load_code(get_shape(name).config_class)
    before = resident_bytes()
    loaded = load_model(str(path), device="cpu", max_context=settings.context)
    memory = load_footprint(before, resident_bytes(), path.stat().st_size, settings.context)
    backend = loaded.backend
    if not backend.quantized_weights:
        raise ConfigError(f"{path.name} did not load in its own formats on the kernels (see the line above)")
    model = ShapeModel(get_shape(name), loaded, "kernels", None, None)
    generator = torch.Generator().manual_seed(settings.seed)  # the float shape's prompt
    prompt = torch.randint(0, loaded.info.vocab_size, (settings.prompt_tokens,), generator=generator).tolist()
    speeds = decode_speeds(model, prompt, settings, hf=False)
    passes = measure_verify_costs(
        backend, sizes=settings.pass_sizes, context=settings.prompt_tokens, repeats=settings.repeats
    )
    shape = model.shape
    entry = {
        "shape": name,
        "source": shape.source,
        "config_class": shape.config_class,
        "model_type": loaded.hf_model.config.model_type,
        "parameters": weights.parameters,
        "dtype": "float32",
        "device": "cpu",
        "backend": "kernels",
        "backend_class": type(backend).__name__,
        **passes_run(backend),
        "fast_path_problem": None,
        "kernels_problem": None,
        "quant": settings.quant,
        "weight_types": list(backend.weight_types),
        "gguf": {
            "path": str(path),
            "file_bytes": path.stat().st_size,
            "written_now": written,
            "tied_embedding": weights.tied,
            "tensor_bytes_by_type": weights.bytes_by_type,
        },
        "weight_bytes": weights.tensor_bytes,
        "bytes_read_per_token": weights.bytes_read_per_token,
        "memory": memory,
        **speeds,
        "hf_generate": None,
        "hf_generate_skipped": HF_SKIPPED,
        "pass_seconds": {str(size): seconds for size, seconds in passes.items()},
        **bound_figures(speeds["specdec_plain"], weights.bytes_read_per_token, bandwidth),
    }
    del model, loaded, backend
    gc.collect()
    if settings.llama_cpp:
        from .llama_bench import compare, run_llama_bench

        if progress:
            progress(f"bench-shape: llama-bench on {path.name}")
        result = run_llama_bench(
            settings.llama_cpp,
            path,
            settings.new_tokens,
            settings.prompt_tokens,
            torch.get_num_threads(),
            settings.repeats,
        )
        entry.update(compare(result, entry))
    return entry


def table_lines(entry: dict) -> list[str]:
    """The console table's lines under a --quant shape's row: the file, and llama-bench's figures."""
    g = entry["gguf"]
    lines = [
        f"  {entry['shape']}: {entry['quant']} file {g['path']} ({g['file_bytes'] / 1e6:.0f} MB), kernels read "
        f"{', '.join(entry['weight_types'])}; {entry['bytes_read_per_token'] / 1e6:.0f} MB a step; hf gen: not "
        f"run (quantized weights)"
    ]
    memory = entry.get("memory", {})
    added = memory.get("resident_bytes_added_by_load")
    if added is not None:
        lines.append(
            f"  {entry['shape']}: the load added {added / 2**20:.0f} MiB resident, "
            f"{memory['over_file_bytes']:.2f}x the file ({memory['own_over_file_bytes']:.2f}x of its own, "
            f"{memory['library_bytes_added_by_load'] / 2**20:.0f} MiB of libraries' pages)"
        )
    lb = entry.get("llama_bench")
    if lb:
        share, decode = entry.get("llama_bench_share_of_bound"), entry.get("specdec_decode_over_llama_bench")
        runs = ", ".join(f"{x:.1f}" for x in lb["samples_tokens_per_s"])
        lines.append(
            f"  {entry['shape']}: llama-bench tg{lb.get('n_gen')} @ d{lb.get('n_depth')}: "
            f"{lb['tokens_per_s']:.1f} tok/s (runs {runs}), {'-' if share is None else f'{share:.0%}'} of "
            f"the bound; specdec plain / llama.cpp {entry['specdec_plain_over_llama_bench']:.2f}x, "
            f"decode steps / llama.cpp {'-' if decode is None else f'{decode:.2f}x'} "
            f"(build {lb.get('build_commit')})"
        )
        request = lb["request"]
        lines.append(
            f"  {entry['shape']}: a request ({request['prompt_tokens']}-token prompt, {request['new_tokens']} new "
            f"tokens), llama-bench pg: {request['new_tokens_per_s']:.1f} new tok/s; specdec's request / llama.cpp's "
            f"{entry['specdec_request_over_llama_bench_request']:.2f}x"
        )
    return lines
