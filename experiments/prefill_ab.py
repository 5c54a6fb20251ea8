"""The prefills of the 26 floor prompts on smollm2's Q4_1 file with the CPU kernels of two source folders (KA, KB:
specdec/kernels of two checkouts) built and loaded in one process, alternated A B B A ...: seconds per round and
whether the two builds' last-token logits are the same bits. Run both orders: the build loaded second has read a few
percent faster with the same code.

    KA=/tmp/old/specdec/kernels KB=specdec/kernels python experiments/prefill_ab.py ../shared/data/specbench_dev.jsonl 6
"""

import hashlib
import os
import sys
import time
from pathlib import Path

import torch

import specdec.kernels as K
from qwen3_kernel_ab import build
from specdec.benchmarks.prompts import load_prompts
from specdec.engine import SpecDecoder
from specdec.models.loading import load_model


def main(prompt_file: str, rounds: int) -> None:
    targets = []
    for module in (build(Path(os.environ["KA"])), build(Path(os.environ["KB"]))):
        K.load = lambda isa=None, module=module: module
        targets.append(load_model("smollm2-135m"))
    prompts = load_prompts(prompt_file, limit=26)
    encoded = [torch.tensor(SpecDecoder(targets[0], None).encode(p.text)) for p in prompts]
    seconds: dict[int, list[float]] = {0: [], 1: []}
    digests = {}
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            backend, digest = targets[i].backend, hashlib.sha256()
            start = time.perf_counter()
            for ids in encoded:
                cache = backend.new_cache()
                digest.update(backend.forward(cache, ids, last_only=True).logits.numpy().tobytes())
                backend.release(cache)
            seconds[i].append(time.perf_counter() - start)
            digests[i] = digest.hexdigest()
    tokens = sum(len(ids) for ids in encoded)
    for i, name in enumerate("AB"):
        print(f"{name}: {tokens} tokens, seconds {[round(s, 2) for s in seconds[i]]}")
    print(f"same bits {digests[0] == digests[1]}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 6)
