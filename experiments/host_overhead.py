"""The host's work per step of plain decoding on the graph path (docs/experiments/gpu_host_overhead.md).

With CUDA graphs the GPU's work in a step is one replay; everything else in the step is the host's: the scheduler,
FastLlama.forward, PassGraphs.run (padding the inputs, copying them into the graph's static inputs, slicing and
cloning the outputs), verification (argmax, one read-back). This runs plain greedy decoding of a tiny random model
with the same code uncaptured on the CPU (graphs "eager"), and splits each step into the shape-static pass itself
(what a graph replays) and the rest (what the host does with graphs too):
  - torch operations per step, counted with a TorchDispatchMode (on a GPU, each one outside the pass is a host call,
    many a kernel launch or a copy);
  - the host's seconds per step outside the pass, from cProfile (tiny model: the pass itself is cheap here, and its
    time is subtracted), and the functions that take them.

    python experiments/host_overhead.py [--tokens 200] [--json out.json]
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import specdec  # noqa: E402 - the checkout on PYTHONPATH, whose tests/ hold the tiny models

sys.path.insert(0, str(Path(specdec.__file__).resolve().parents[1] / "tests"))


REPEATS = 5
FUNCTIONS = ("specdec/scheduler.py:step", "models/llama.py:forward", "models/pass_graphs.py:run",
             "models/pass_graphs.py:_fill", "models/pass_graphs.py:padded_inputs", "models/static_pass.py:copy_",
             "models/host_inputs.py:fill",
             "models/pass_graphs.py:_execute", "verify/__init__.py:verify", "specdec/request.py:take_step",
             "specdec/scheduler.py:_verify")  # cumulative under cProfile (its overhead included), per step


class OpCounter(TorchDispatchMode):
    """Counts aten operations, apart for those inside the shape-static pass (`inside` set by the caller)."""

    def __init__(self):
        super().__init__()
        self.inside = False
        self.counts = {True: Counter(), False: Counter()}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[self.inside][str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def decoder_and_prompt(seed: int = 0):
    from specdec.engine import SpecDecoder
    from tiny import loaded, tiny_llama

    model = tiny_llama(seed=seed, hidden=64, heads=4, kv_heads=2)
    target = loaded(model, "torch", graphs="on")  # graphs on, uncaptured on the CPU
    prompt = torch.randint(0, 63, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
    return SpecDecoder(target, None), target.backend, prompt


def measure(tokens: int) -> dict:
    import specdec.models.pass_graphs as pass_graphs
    from specdec.config import GenerationConfig

    decoder, backend, prompt = decoder_and_prompt()
    config = GenerationConfig(max_new_tokens=tokens, ignore_eos=True)
    decoder.generate_ids(prompt, config)  # warm

    plain_pass = pass_graphs.static_pass
    counter = OpCounter()
    pass_seconds = [0.0]

    def counted_pass(*args, **kwargs):
        counter.inside = True
        t0 = time.perf_counter()
        try:
            return plain_pass(*args, **kwargs)
        finally:
            pass_seconds[0] += time.perf_counter() - t0
            counter.inside = False

    pass_graphs.static_pass = counted_pass
    try:
        with counter:
            decoder.generate_ids(prompt, config)
        steps = tokens - 1  # the first token comes from the prefill (eager, not counted as a step's)
        prefill_ops = _prefill_ops(decoder, prompt)
        outside = sum(counter.counts[False].values()) - prefill_ops
        first_token = GenerationConfig(max_new_tokens=1, ignore_eos=True)
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            decoder.generate_ids(prompt, first_token)  # the prefill and first token, to subtract
        prefill = (time.perf_counter() - t0) / REPEATS
        pass_seconds[0] = 0.0
        t0 = time.perf_counter()
        for _ in range(REPEATS):
            decoder.generate_ids(prompt, config)
        host = (time.perf_counter() - t0 - pass_seconds[0] - REPEATS * prefill) / (REPEATS * steps)
        profile = cProfile.Profile()
        profile.enable()
        decoder.generate_ids(prompt, config)
        profile.disable()
    finally:
        pass_graphs.static_pass = plain_pass
    stats = pstats.Stats(profile).stats
    cumulative = {f"{Path(k[0]).parent.name}/{Path(k[0]).name}:{k[2]}": v[3] for k, v in stats.items()}
    return {"steps": steps, "ops_per_step_outside_pass": round(outside / steps, 1),
            "ops_per_step_inside_pass": round(sum(counter.counts[True].values()) / steps, 1),
            "ops_outside_pass_per_step": {k: round(v / steps, 2) for k, v in counter.counts[False].most_common(20)},
            "host_us_per_step_outside_pass": round(1e6 * host, 1),
            "profiled_us_per_step": {name: round(1e6 * cumulative.get(name, 0.0) / steps, 1) for name in FUNCTIONS}}


def fill_us(shape=(1, 1), tokens: int = 1, length: int = 100) -> dict:
    """The bucket's inputs built and copied into its static inputs, per call (the best of several timings): the
    padded_inputs way (a dozen small tensors, six copies) and HostInputs.fill (in place, two copies on a GPU)."""
    import timeit

    from specdec.models.backend import SequenceCache
    from specdec.models.host_inputs import HostInputs
    from specdec.models.pass_graphs import padded_inputs
    from specdec.models.static_pass import StaticInputs

    caches = [SequenceCache(length=length, slot=b) for b in range(shape[0])]
    ids = [torch.arange(tokens) for _ in caches]
    static = StaticInputs.empty(*shape, torch.device("cpu"))
    host = HostInputs(*shape, 511, torch.device("cpu"))
    ways = {"padded_inputs_and_copies": lambda: static.copy_(padded_inputs(shape, caches, ids, None, 511)),
            "host_inputs_fill": lambda: host.fill(caches, ids, None)}
    return {name: round(1e6 * min(timeit.repeat(way, number=200, repeat=7)) / 200, 1) for name, way in ways.items()}


def _prefill_ops(decoder, prompt) -> int:
    """aten operations of a request's prefill and first token alone (max_new_tokens 1)."""
    from specdec.config import GenerationConfig

    counter = OpCounter()
    with counter:
        decoder.generate_ids(prompt, GenerationConfig(max_new_tokens=1, ignore_eos=True))
    return sum(counter.counts[False].values()) + sum(counter.counts[True].values())


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    result = measure(args.tokens)
    try:
        result["fill_us_decode_1x1"] = fill_us()
        result["fill_us_batch_4x8"] = fill_us((4, 8), 5)
    except ImportError:  # a checkout before host_inputs.py
        pass
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
