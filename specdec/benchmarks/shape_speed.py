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


BANDWIDTH_BUFFER_BYTES = 512 << 20  # 16x a 32 MiB L3 cache, 10x an H100's L2: the reads come from memory


class BandwidthProbe:
    """A buffer much larger than the caches, held for reading again: each read() is the bytes per second of the
    fastest of `reads` full reads, each read once as float32 sums and once as a byte maximum (whichever this machine
    runs nearer its memory's speed)."""

    def __init__(self, device: torch.device, buffer_bytes: int = BANDWIDTH_BUFFER_BYTES):
        self.device, self.bytes = device, buffer_bytes
        self.buffer = torch.ones(buffer_bytes // 4, dtype=torch.float32, device=device)  # written: pages mapped

    def read(self, reads: int = 5) -> float:
        as_bytes = self.buffer.view(torch.uint8)
        return self.bytes / min(timed(op, self.device) for _ in range(reads) for op in (self.buffer.sum, as_bytes.amax))


def memory_read_bandwidth(device: torch.device, buffer_bytes: int = BANDWIDTH_BUFFER_BYTES, reads: int = 5) -> float:
    """The memory's read bandwidth, bytes per second (BandwidthProbe's read, the buffer freed after)."""
    return BandwidthProbe(device, buffer_bytes).read(reads)


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
    probe = BandwidthProbe(device) if device.type == "cpu" else None
    bandwidths = []  # the memory's read bandwidth just before each timed run of specdec's (a shared host's drifts)
    for i in range(settings.repeats):
        for name, run in list(methods.items()) if i % 2 == 0 else list(methods.items())[::-1]:
            if probe is not None and name == "specdec_plain":
                bandwidths.append(probe.read(reads=2))
            seconds[name].append(timed(run, device))
            made[name] = outputs[name]
    del probe
    result: dict[str, Any] = {}
    for name in methods:
        if len(made[name]) != n:
            raise RuntimeError(f"{name} made {len(made[name])} tokens, not the {n} asked for")
        result[name] = {"tokens_per_s": n / _median(seconds[name]), "seconds": seconds[name], "tokens": n}
    # the steps after the prompt's prefill (which makes the first token): what the bandwidth bound is about
    after_prefill = [total - prefill for total, prefill in zip(seconds["specdec_plain"], prefill_s[1:])]
    result["specdec_plain"]["decode_tokens_per_s"] = (n - 1) / _median(after_prefill) if n > 1 else None
    if n > 1 and bandwidths:
        result["specdec_plain"]["decode_tokens_per_s_by_run"] = [(n - 1) / s for s in after_prefill]
        result["specdec_plain"]["read_bandwidth_before_run"] = bandwidths
    if not hf:
        return {**result, "specdec_over_hf_generate": None, "same_tokens_as_hf_generate": None}
    result["specdec_over_hf_generate"] = result["specdec_plain"]["tokens_per_s"] / result["hf_generate"]["tokens_per_s"]
    # a sanity figure, not a check: in bfloat16 a near-tie may break either way in the two implementations
    result["same_tokens_as_hf_generate"] = made["specdec_plain"] == made["hf_generate"]
    return result


def bound_figures(plain: dict, per_token: int, bandwidth: float | None) -> dict:
    """The bandwidth bound on decoding (tokens/s) for a step reading `per_token` bytes, and the share of it that
    specdec's plain decoding (`plain`: decode_speeds' entry) reaches with and without the prompt's pass; on a CPU
    also each run's decoding against the bandwidth read just before that run, and their median (paired: on a
    shared host the bandwidth moves by a quarter within minutes, and one reading at the start may be a quiet or a
    busy moment that the runs do not share)."""
    if not bandwidth:
        return {}
    bound = bandwidth / per_token
    decode = plain["decode_tokens_per_s"]
    figures = {
        "bandwidth_bound_tokens_per_s": bound,
        "specdec_plain_share_of_bound": plain["tokens_per_s"] / bound,  # prefill included
        "specdec_decode_share_of_bound": decode / bound if decode else None,
    }
    if "read_bandwidth_before_run" in plain:  # each run's decoding against the bandwidth read just before it
        shares = [
            r * per_token / b for r, b in zip(plain["decode_tokens_per_s_by_run"], plain["read_bandwidth_before_run"])
        ]
        figures["specdec_decode_share_of_bound_by_run"] = shares
        figures["specdec_decode_share_of_bound_paired"] = _median(shares)
    return figures


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
