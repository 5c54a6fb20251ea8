"""`specdec bench-shape`: the speed of named model shapes with random weights (models/shapes.py).

Per shape, on the same weights in one process: specdec's plain decoding (the engine's own step, no drafter),
transformers' greedy `generate`, the time of one target pass over T new tokens after the prompt, and the weights'
bytes; with the device's measured memory read bandwidth, the bandwidth bound on decoding (bandwidth over the bytes
a step reads) and the share of it plain decoding reaches. Random weights make acceptance meaningless: it measures
speed only and reports no acceptance. With `quant`, the same on the shape written as a GGUF file in that format, run
in it on the CPU kernels, and with `llama_cpp` llama-bench on that file too (shape_gguf.py).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from ..costs import measure_verify_costs
from ..errors import ConfigError
from ..models.shapes import bytes_read_per_token, load_shape, weight_bytes
from .runner import machine_info, stamp
from .shape_speed import BANDWIDTH_BUFFER_BYTES, bound_figures, decode_speeds, memory_read_bandwidth, passes_run

SPEED_ONLY_NOTE = (
    "random weights: speed only. The outputs mean nothing, so no acceptance, MAT or drafter figure is reported."
)


@dataclass(frozen=True)
class ShapeBenchSettings:
    device: str = "auto"
    dtype: str = "auto"
    backend: str = "auto"
    graphs: str = "auto"  # the torch backend's passes as CUDA graphs (GRAPHS)
    compile: str = "auto"  # those passes compiled by torch.compile (COMPILE)
    prompt_tokens: int = 125
    new_tokens: int = 128
    pass_sizes: tuple[int, ...] = (1, 4, 16, 64)
    repeats: int = 3
    seed: int = 0
    quant: str | None = None  # a GGUF format of shape_gguf.QUANTS: run the shape's file in it
    llama_cpp: str | None = None  # a folder with llama-bench: run it on that file too

    def check(self) -> None:
        for option, value in (
            ("--prompt-tokens", self.prompt_tokens),
            ("--new-tokens", self.new_tokens),
            ("--repeats", self.repeats),
        ):
            if value < 1:
                raise ConfigError(f"{option} must be >= 1, got {value}")
        if not self.pass_sizes or min(self.pass_sizes) < 1:
            raise ConfigError(f"pass sizes must be whole numbers >= 1, got {list(self.pass_sizes)}")
        from .shape_gguf import QUANTS

        if self.quant is not None and self.quant not in QUANTS:
            raise ConfigError(f"--quant takes {', '.join(QUANTS)}, not {self.quant!r}")
        if self.llama_cpp and not self.quant:
            raise ConfigError(
                f"--llama-cpp runs llama-bench on the shape's GGUF file: it needs --quant ({', '.join(QUANTS)})"
            )

    @property
    def context(self) -> int:
        """KV cache rows a shape needs: the prompt, then the longer of the generation and the largest pass."""
        return self.prompt_tokens + max(self.new_tokens, max(self.pass_sizes)) + 16


def parse_sizes(text: str, option: str = "--pass-sizes") -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16): whole numbers >= 1, each once, in the order given."""
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{option} takes comma-separated whole numbers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise ConfigError(f"{option} takes whole numbers >= 1, got {text!r}")
    return tuple(dict.fromkeys(sizes))


def bench_one(name: str, settings: ShapeBenchSettings, bandwidth: float | None, progress=None) -> dict:
    """One shape's figures (see the module's docstring); its model is freed before returning."""
    if settings.quant:
        from .shape_gguf import bench_quantized

        return bench_quantized(name, settings, bandwidth, progress)
    model = load_shape(
        name,
        settings.device,
        settings.dtype,
        settings.backend,
        seed=settings.seed,
        max_context=settings.context,
        graphs=settings.graphs,
        compile=settings.compile,
    )
    info, hf_model = model.loaded.info, model.loaded.hf_model
    generator = torch.Generator().manual_seed(settings.seed)
    prompt = torch.randint(0, info.vocab_size, (settings.prompt_tokens,), generator=generator).tolist()
    speeds = decode_speeds(model, prompt, settings)
    passes = measure_verify_costs(
        model.loaded.backend, sizes=settings.pass_sizes, context=settings.prompt_tokens, repeats=settings.repeats
    )
    per_token = bytes_read_per_token(hf_model)
    entry = {
        "shape": name,
        "source": model.shape.source,
        "config_class": model.shape.config_class,
        "model_type": hf_model.config.model_type,
        "parameters": sum(p.numel() for p in hf_model.parameters()),
        "dtype": str(info.dtype).replace("torch.", ""),
        "device": str(info.device),
        "backend": model.backend_name,
        "backend_class": type(model.loaded.backend).__name__,
        **passes_run(model.loaded.backend),
        "fast_path_problem": model.fast_path_problem,
        "kernels_problem": model.kernels_problem,
        "weight_bytes": weight_bytes(hf_model),
        "bytes_read_per_token": per_token,
        **speeds,
        "pass_seconds": {str(size): seconds for size, seconds in passes.items()},
        **bound_figures(speeds["specdec_plain"], per_token, bandwidth),
    }
    del model, hf_model
    gc.collect()
    if info.device.type == "cuda":
        torch.cuda.empty_cache()
    return entry


def environment(device: torch.device) -> dict:
    import transformers

    return {
        **stamp(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        "machine": machine_info(),
    }


def run_shapes(names: list[str], settings: ShapeBenchSettings, progress=None) -> dict:
    """The bench-shape JSON for these shapes, measured one after another on one device."""
    from ..models.backend_choice import check_backend
    from ..models.devices import resolve_device

    settings.check()
    check_backend(settings.backend)
    from ..models.family import fast_path_problem
    from ..models.shapes import shape_config

    for name in names:  # every name, and the backend asked for each, is checked before anything is built
        problem = fast_path_problem(shape_config(name))
        if problem and settings.backend not in ("auto", "hf"):
            raise ConfigError(f"the {settings.backend} backend does not support the {name} shape: {problem}")
    device = resolve_device(settings.device)
    if settings.quant:
        from .shape_gguf import check_quant

        check_quant(names, settings, device)
    bandwidth = memory_read_bandwidth(device)
    out = {
        "kind": "bench-shape",
        "speed_only": True,
        "note": SPEED_ONLY_NOTE,
        **environment(device),
        "device": str(device),
        "settings": {
            "dtype": settings.dtype,
            "backend": settings.backend,
            "graphs": settings.graphs,
            "compile": settings.compile,
            "prompt_tokens": settings.prompt_tokens,
            "new_tokens": settings.new_tokens,
            "pass_sizes": list(settings.pass_sizes),
            "repeats": settings.repeats,
            "seed": settings.seed,
            "quant": settings.quant,
            "llama_cpp": settings.llama_cpp,
            "threads": torch.get_num_threads(),
        },
        "memory_read_bandwidth_bytes_per_s": bandwidth,
        "bandwidth_buffer_bytes": BANDWIDTH_BUFFER_BYTES,
        "shapes": [],
    }
    for name in names:
        if progress:
            progress(f"bench-shape: {name}")
        out["shapes"].append(bench_one(name, settings, bandwidth, progress))
    return out


def table(result: dict) -> str:
    """A console table: one row per shape."""
    sizes = result["settings"]["pass_sizes"]
    head = (
        f"{'shape':<14} {'backend':<8} {'params':>7} {'specdec':>8} {'hf gen':>8} {'ratio':>6} {'bound':>8} "
        f"{'share':>6} {'decode':>6}  " + " ".join(f"{'pass ' + str(s):>9}" for s in sizes)
    )
    weights = result["settings"].get("quant") or result["settings"]["dtype"]
    lines = [
        f"bench-shape | {result['device']} {result.get('gpu') or ''} | {weights} | prompt "
        f"{result['settings']['prompt_tokens']}, {result['settings']['new_tokens']} new tokens | tok/s; pass "
        f"times in ms; share: of the bandwidth bound, prefill included; decode: the steps after it | "
        f"{SPEED_ONLY_NOTE}",
        head,
        "-" * len(head),
    ]
    for s in result["shapes"]:
        bound, share = s.get("bandwidth_bound_tokens_per_s"), s.get("specdec_plain_share_of_bound")
        decode = s.get("specdec_decode_share_of_bound")
        hf, ratio = s["hf_generate"], s["specdec_over_hf_generate"]  # None: not run (--quant)
        hf = "-" if hf is None else f"{hf['tokens_per_s']:.1f}"
        lines.append(
            f"{s['shape']:<14} {s['backend']:<8} {s['parameters'] / 1e6:>6.0f}M "
            f"{s['specdec_plain']['tokens_per_s']:>8.1f} {hf:>8} "
            f"{'-' if ratio is None else f'{ratio:.2f}x':>6} {'-' if bound is None else f'{bound:.1f}':>8} "
            f"{'-' if share is None else f'{share:.0%}':>6} {'-' if decode is None else f'{decode:.0%}':>6}  "
            + " ".join(f"{s['pass_seconds'][str(size)] * 1e3:>9.2f}" for size in sizes)
        )
        if (paired := s.get("specdec_decode_share_of_bound_paired")) is not None:
            runs = ", ".join(f"{share:.0%}" for share in s["specdec_decode_share_of_bound_by_run"])
            lines.append(
                f"  {s['shape']}: decode share of the bandwidth read just before each run: {paired:.0%} ({runs})"
            )
        if s["fast_path_problem"]:
            lines.append(f"  {s['shape']}: transformers' forward (hf): {s['fast_path_problem']}")
        if s["kernels_problem"]:
            lines.append(f"  {s['shape']}: the torch forward, not the kernels: {s['kernels_problem']}")
        if s.get("quant"):
            from .shape_gguf import table_lines

            lines.extend(table_lines(s))
    return "\n".join(lines)
