"""Two kernel source folders (KA, KB) built and loaded in one process: products of ROWS rows (default 1: a decoding
step's) over COPIES random matrices of N x K in each GGUF format (16 of 8192 x 2048 by default: read from memory),
THREADS threads, the builds alternated over ROUNDS rounds; minimum and median time a product, the read rate, and
whether the two builds' outputs are the same bits. KA = KB times one build against itself (the host's noise).

    KA=specdec/kernels KB=/tmp/variant/kernels python experiments/onerow_formats_ab.py
"""
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_gguf_kernels import random_blocks
from qwen3_kernel_ab import build
from specdec.models.gguf_blocks import read_rows
from specdec.models.quantized_args import pack_rows
mods = [build(Path(os.environ["KA"])), build(Path(os.environ["KB"]))]
torch.set_num_threads(int(os.environ.get("THREADS", 2)))
n, k = int(os.environ.get("N", 8192)), int(os.environ.get("K", 2048))
rows = int(os.environ.get("ROWS", 1))
fmts = os.environ.get("FMTS", "Q4_0,Q4_1,Q4_K,Q5_K,Q6_K,Q8_0").split(",")
copies = int(os.environ.get("COPIES", 16))
for fmt in fmts:
    ws = [read_rows(fmt, random_blocks(fmt, n, k, seed=s)) for s in range(copies)]
    packs = [[pack_rows(m, w) for w in ws] for m in mods]
    x = torch.randn(rows, k)
    same = all(torch.equal(mods[0].packed_matmul(x, packs[0][i], ws[i].fmt, n, k), mods[1].packed_matmul(x, packs[1][i], ws[i].fmt, n, k)) for i in range(copies))
    best = [[], []]
    for r in range(int(os.environ.get("ROUNDS", 10))):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            t = time.perf_counter()
            for p, w in zip(packs[i], ws): mods[i].packed_matmul(x, p, w.fmt, n, k)
            best[i].append((time.perf_counter() - t) / copies)
    raw = random_blocks(fmt, n, k).nbytes
    a, b = sorted(best[0]), sorted(best[1])
    print(f"{fmt} rows {rows}: A min {a[0]*1e3:.3f} med {a[len(a)//2]*1e3:.3f} ms ({raw/a[0]/1e9:.1f} GB/s) | B min {b[0]*1e3:.3f} med {b[len(b)//2]*1e3:.3f} ms ({raw/b[0]/1e9:.1f} GB/s) | B/A med {b[len(b)//2]/a[len(a)//2]:.3f} same bits {same}", flush=True)
