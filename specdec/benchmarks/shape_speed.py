"""The timings bench-shape takes of a shape's model (bench/shapes.py, float weights; bench/shape_gguf.py, a GGUF
file's): plain decoding's speed with and without the prompt's pass, the bandwidth bound's figures, and which
passes the kernels ran."""

from __future__ import annotations

import time
from typing import Any

import torch

from ..config import GenerationConfig
from ..engine import SpecDecoder
from ..models.shapes import ShapeModel


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device: torch.device) -> float:
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


@torch.inference_mode()
def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


@torch.inference_mode()
def decode_speeds(model: ShapeModel, prompt: list[int], settings, hf: bool = True) -> dict:
    """tokens/s of specdec's plain decoding and (with `hf`) of transformers' greedy generate on `prompt`: the median
    of `repeats` runs each (after one short untimed run each), the two alternating run by run. specdec decodes
    with ignore_eos: a GGUF file's made-up vocabulary has an EOS that random weights may emit."""
    loaded, device = model.loaded, model.loaded.info.device
    decoder = SpecDecoder(loaded, None)
    n = settings.new_tokens
    ids = torch.tensor([prompt], device=device)
    outputs, prefill_s = {}, []

    def specdec_plain(tokens: int = n) -> None:
        config = GenerationConfig.create(max_new_tokens=tokens, ignore_eos=True)
        outputs["specdec_plain"], metrics = decoder.generate_ids(prompt, config)
        prefill_s.append(metrics.prefill_time_s)

    def hf_generate(tokens: int = n) -> None:
        out = loaded.hf_model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens, do_sample=False, pad_token_id=0
        )  # the shape has no EOS: all n come
        outputs["hf_generate"] = out[0, len(prompt) :].tolist()

    methods = {"specdec_plain": specdec_plain, "hf_generate": hf_generate} if hf else {"specdec_plain": specdec_plain}
    for run in methods.values():
        run(min(8, n))
    seconds: dict[str, list[float]] = {name: [] for name in methods}
    made = {}
    for i in range(settings.repeats):
        for name, run in list(methods.items()) if i % 2 == 0 else list(methods.items())[::-1]:
            seconds[name].append(timed(run, device))
            made[name] = outputs[name]
    result: dict[str, Any] = {}
    for name in methods:
        if len(made[name]) != n:
            raise RuntimeError(f"{name} made {len(made[name])} tokens, not the {n} asked for")
        result[name] = {"tokens_per_s": n / _median(seconds[name]), "seconds": seconds[name], "tokens": n}
    # the steps after the prompt's prefill (which makes the first token): what the bandwidth bound is about
    after_prefill = [total - prefill for total, prefill in zip(seconds["specdec_plain"], prefill_s[1:])]
    result["specdec_plain"]["decode_tokens_per_s"] = (n - 1) / _median(after_prefill) if n > 1 else None
    if not hf:
        return {**result, "specdec_over_hf_generate": None, "same_tokens_as_hf_generate": None}
    result["specdec_over_hf_generate"] = result["specdec_plain"]["tokens_per_s"] / result["hf_generate"]["tokens_per_s"]
    # a sanity figure, not a check: in bfloat16 a near-tie may break either way in the two implementations
    result["same_tokens_as_hf_generate"] = made["specdec_plain"] == made["hf_generate"]
    return result


def bound_figures(plain: dict, per_token: int, bandwidth: float | None) -> dict:
    """The bandwidth bound on decoding (tokens/s) for a step reading `per_token` bytes, and the share of it that
    specdec's plain decoding (`plain`: decode_speeds' entry) reaches with and without the prompt's pass."""
    if not bandwidth:
        return {}
    bound = bandwidth / per_token
    decode = plain["decode_tokens_per_s"]
    return {
        "bandwidth_bound_tokens_per_s": bound,
        "specdec_plain_share_of_bound": plain["tokens_per_s"] / bound,  # prefill included
        "specdec_decode_share_of_bound": decode / bound if decode else None,
    }


def passes_run(backend) -> dict:
    """How the backend's decode passes ran: {"graphs": "cuda" (captured), "eager" (shape-static, uncaptured) or
    "off", "compiled": bool, "screened_head": whether greedy passes read the LM head's 8-bit copy}."""
    graphs = backend.pass_graphs
    run = (
        {"graphs": "off", "compiled": False}
        if graphs is None
        else {"graphs": "cuda" if graphs.capture else "eager", "compiled": graphs.compiled}
    )
    return {**run, "screened_head": backend.screened_head}
