"""The CPU kernels of two source folders (KA, KB: specdec/kernels of two checkouts) built and loaded in one process,
the same GGUF model on each, target passes alternated A B B A ...: medians of each pass size and whether the two
builds' logits are the same bits. mode "seq": one sequence after 250 cached tokens, passes of 1 to 16 tokens; "batch":
16 sequences of 250-400 cached tokens, one-token passes over 1, 4 or 16 of them. The build loaded second came out a
few percent faster with the same code, so run each comparison in both orders.

    KA=/tmp/old/specdec/kernels KB=specdec/kernels python experiments/kernels_ab.py smollm2-135m seq 40
"""

import hashlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec.kernels as K
from qwen3_kernel_ab import build
from specdec.models.loading import load_model


def main(model: str, mode: str, rounds: int) -> None:
    modules = [build(Path(os.environ["KA"])), build(Path(os.environ["KB"]))]
    backends = []
    for module in modules:
        K.load = lambda isa=None, module=module: module
        backends.append(load_model(model).backend)
    torch.manual_seed(0)
    lengths = [250 + 10 * i for i in range(16 if mode == "batch" else 1)]
    prompts = [torch.randint(0, 40000, (n,)) for n in lengths]
    caches = []
    for backend in backends:
        caches.append([backend.new_cache() for _ in prompts])
        for cache, prompt in zip(caches[-1], prompts):
            backend.forward(cache, prompt, last_only=True)
    sizes = [1, 4, 16] if mode == "batch" else [1, 2, 4, 8, 16]
    inputs = {
        R: [torch.randint(0, 40000, (1 if mode == "batch" else R,)) for _ in range(R if mode == "batch" else 1)]
        for R in sizes
    }
    seconds = {(i, R): [] for i in range(2) for R in sizes}
    digests = {}
    for r in range(rounds):
        for i in (0, 1) if r % 2 == 0 else (1, 0):
            backend, cs = backends[i], caches[i]
            for R in sizes:
                start = time.perf_counter()
                if mode == "batch":
                    outs = backend.forward_batch(cs[:R], inputs[R])
                else:
                    outs = [backend.forward(cs[0], inputs[R][0])]
                seconds[(i, R)].append(time.perf_counter() - start)
                digests.setdefault(
                    (i, R), hashlib.sha256(b"".join(o.logits.numpy().tobytes() for o in outs)).hexdigest()
                )
                for cache, n in zip(cs, lengths):
                    backend.truncate(cache, n)
    for R in sizes:
        a, b = (statistics.median(seconds[(i, R)][3:]) for i in (0, 1))
        print(
            f"{R}: A {a * 1e3:.3f} ms, B {b * 1e3:.3f} ms, B/A {b / a:.3f}, same bits {digests[(0, R)] == digests[(1, R)]}"
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "seq", int(sys.argv[3]) if len(sys.argv) > 3 else 30)
