"""What a group's float32 step costs the several-row AVX2 tile: the kernels as they are against a copy whose Q4_1 tile
adds each group's integer sums instead (one conversion at the end: wrong outputs, so a measurement only), one Q4_1
product of 768 x 576 (in L2) on one thread, both builds in one process, alternated; best of six rounds each.

    python experiments/group_step_share.py

On an AVX-512 build the tile in quantized.h runs instead, which this patch does not touch (both builds then read
alike).
"""

import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from qwen3_kernel_ab import build  # noqa: E402
from test_gguf_kernels import random_blocks  # noqa: E402

from specdec.models.gguf_blocks import read_rows  # noqa: E402
from specdec.models.quantized_args import pack_rows  # noqa: E402

KERNELS = Path(__file__).resolve().parents[1] / "specdec" / "kernels"
STEP = "    group_step<MR, FMT>(x, row0, g, G, block, v, super_d[v], super_m[v], isum, half_sum, acc);\n"
LOOP = "  for (int64_t g = 0; g < G; ++g, x0 += kQGroup"


def without_group_step(directory: Path) -> None:
    """Patches quantized_rows.h in `directory`: Q4_1's groups add their integer sums, converted once at the end."""
    path = directory / "quantized_rows.h"
    source = path.read_text()
    assert STEP + "  }\n}\n" in source and LOOP in source, "quantized_rows.h changed: update the patch"
    adds = (
        "    if constexpr (FMT == Q4) {\n      for (int j = 0; j < MR; ++j) total[j] = qv::add32(total[j], isum[j]);\n"
        "    } else {\n  " + STEP + "    }\n"
    )
    end = "  if constexpr (FMT == Q4) for (int j = 0; j < MR; ++j) acc[j] = qv::to_float(total[j]);\n}\n"
    source = source.replace(STEP + "  }\n}\n", adds + "  }\n" + end, 1)
    source = source.replace(
        LOOP, "  qv::i32x16 total[MR];\n  for (int j = 0; j < MR; ++j) total[j] = qv::zero();\n" + LOOP, 1
    )
    path.write_text(source)


def main() -> None:
    torch.set_num_threads(1)
    patched = Path(tempfile.mkdtemp()) / "kernels"
    shutil.copytree(KERNELS, patched)
    without_group_step(patched)
    builds = {"as is": build(KERNELS), "no group step": build(patched)}
    n, k = 768, 576
    weights = read_rows("Q4_1", random_blocks("Q4_1", n, k))
    packed = {name: pack_rows(module, weights) for name, module in builds.items()}
    for rows in (4, 16, 64):
        x = torch.randn(rows, k)
        best = dict.fromkeys(builds, float("inf"))
        for _ in range(6):
            for name, module in builds.items():
                reps = max(20, 4000 // rows)
                start = time.perf_counter()
                for _ in range(reps):
                    module.packed_matmul(x, packed[name], weights.fmt, n, k)
                best[name] = min(best[name], (time.perf_counter() - start) / reps)
        rates = ", ".join(f"{name} {rows * n * k / s / 1e9:.1f} GMAC/s" for name, s in best.items())
        print(f"{rows} rows: {rates}; the group step {1 - best['no group step'] / best['as is']:.0%} of the time")


if __name__ == "__main__":
    main()
