"""The CPU kernels of this checkout (A) against a variant of them (B) on the Qwen3-0.6B shape in bfloat16 with random
weights, both built and loaded in one process and alternated A B B A ..., so that a busy spell on a shared machine
falls on both. Each round runs a 125-token prompt and `--tokens` one-token steps; every round's logits must equal the
first round's bit for bit (a variant may change speed only).

Times: the prompt's pass in CPU seconds of the calling thread (meaningful with OMP_NUM_THREADS=1, where the pass
runs in that thread; robust to other processes, which only take wall time), and each one-token step in wall seconds
(the decode figure; meaningful only on a quiet machine: with the cores oversubscribed, OpenMP's spinning barriers
make two-thread passes many times slower).

Variants (text edits of a temporary copy of specdec/kernels, AVX2 builds only):
  prefetch  the one-row tile's software prefetch of its four weight streams --distance bytes ahead instead of
            products.h's 1024 (0: none, the kernels before it)
  widen     for prompts (3+ groups of rows), each block widened to float32 once per thread, then float32 tiles
  one-stream  quantized blocks (quantized_layout.h) as one stream each, as AVX-512 builds lay them out, instead of
            a stream per 64-byte unit; with --argmax-only, the steps read the LM head's 8-bit copy

    OMP_NUM_THREADS=1 python experiments/qwen3_kernel_ab.py --variant widen --rounds 5 --tokens 2
    python experiments/qwen3_kernel_ab.py --variant one-stream --argmax-only --rounds 12 --tokens 48
    OMP_NUM_THREADS=1 python experiments/qwen3_kernel_ab.py --variant prefetch --distance 0 --rounds 6 --tokens 48
    python experiments/qwen3_kernel_ab.py --variant prefetch --distance 0 --rounds 6 --tokens 64  # a quiet machine
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREFETCH_SETTING = "constexpr int64_t kPrefetchBytes = 1024;"  # the AVX2 build's, in products.h
STREAMS_SETTING = "  static constexpr int kStreams = kUnits;"  # the AVX2 build's, in quantized_layout.h
UNIT_TILE = ("      tile_rows<WT>(std::min<int64_t>(kMaxRows, M - m), xc + m * K * XS, K, packed + b * block_bytes, "
             "valid,\n                    bias ? bias + n : nullptr, y + m * ldy + n, ldy);")
WIDEN = """      const int64_t rows = std::min<int64_t>(kMaxRows, M - m);
#ifndef SPECDEC_AVX512
      if constexpr (WT == BF16 || WT == F16) {
        if (groups >= 3) {
          thread_local std::vector<float> wide;
          thread_local const char* widened = nullptr;
          const char* block = packed + b * block_bytes;
          if (block != widened) {
            if (static_cast<int64_t>(wide.size()) < kBlockCols * K) wide.resize(kBlockCols * K);
            for (int64_t e = 0; e < kBlockCols * K; e += 16) vec::store(wide.data() + e, load16<WT>(block, e));
            widened = block;
          }
          tile_rows<F32>(rows, xc + m * K * XS, K, reinterpret_cast<const char*>(wide.data()), valid,
                         bias ? bias + n : nullptr, y + m * ldy + n, ldy);
          if (u == u1 - 1) widened = nullptr;
          continue;
        }
      }
#endif
      tile_rows<WT>(rows, xc + m * K * XS, K, packed + b * block_bytes, valid, bias ? bias + n : nullptr,
                    y + m * ldy + n, ldy);"""


def variant_sources(name: str, distance: int, into: Path) -> Path:
    """A copy of specdec/kernels with the variant's edit, in `into`."""
    src = ROOT / "specdec" / "kernels"
    for path in src.iterdir():
        if path.suffix in (".h", ".cpp"):
            shutil.copy(path, into / path.name)
    edited = into / ("quantized_layout.h" if name == "one-stream" else "products.h")
    text = edited.read_text()
    old, new = {"prefetch": (PREFETCH_SETTING, PREFETCH_SETTING.replace("1024", str(distance))),
                "widen": (UNIT_TILE, WIDEN),
                "one-stream": (STREAMS_SETTING, STREAMS_SETTING.replace("kUnits;", "1;"))}[name]
    if old not in text:
        sys.exit(f"{edited.name} no longer holds the code the {name} variant edits")
    edited.write_text(text.replace(old, new))
    return into


def build(directory: Path):
    """The extension built from the sources in `directory`, as specdec.kernels builds its own (flags and OpenMP)."""
    from torch.utils import cpp_extension

    import specdec.kernels as kernels

    names = [kernels.SOURCE.name, *(p.name for p in kernels.HEADERS)]
    source = b"".join((directory / name).read_bytes() for name in names)
    flags = kernels.build_flags(kernels.instruction_set())
    tag = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:12]
    build_dir = Path(tempfile.gettempdir()) / "specdec_kernel_ab" / tag
    build_dir.mkdir(parents=True, exist_ok=True)
    return cpp_extension.load(name=f"specdec_kernel_ab_{tag}", sources=[str(directory / kernels.SOURCE.name)],
                              build_directory=str(build_dir),
                              extra_cflags=["-O3", *flags, "-ffp-contract=off", "-fopenmp"],
                              extra_ldflags=kernels._openmp_link_flags())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", choices=("prefetch", "widen", "one-stream"), required=True)
    parser.add_argument("--distance", type=int, default=0, help="prefetch: bytes ahead in each stream (0: none)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--tokens", type=int, default=32, help="one-token steps after the prompt, per round")
    parser.add_argument("--argmax-only", action="store_true",
                        help="passes as greedy decoding asks for them (the screened LM head where the kernels have it)")
    parser.add_argument("--out-json", default=None)
    args = parser.parse_args()

    import torch

    import specdec.kernels as kernels
    from specdec.models.kernel_llama import KernelLlama
    from specdec.models.shapes import load_shape

    if kernels.instruction_set() != "avx2":
        sys.exit("the variants edit the AVX2 build's code: run on an AVX2-only CPU")
    with tempfile.TemporaryDirectory() as tmp:
        modules = [build(ROOT / "specdec" / "kernels"), build(variant_sources(args.variant, args.distance, Path(tmp)))]
    model = load_shape("qwen3-0.6b", "cpu", "bfloat16", "hf", seed=0, max_context=512)
    backends = []
    for module in modules:  # KernelLlama builds on whatever specdec.kernels.load returns
        kernels.load = lambda isa=None, module=module: module
        backends.append(KernelLlama(model.loaded.hf_model, model.loaded.info, max_context=512))
    prompt = torch.randint(0, 151936, (125,), generator=torch.Generator().manual_seed(0))

    def run(backend) -> tuple[float, list[float], torch.Tensor]:
        cache = backend.new_cache()
        start = time.thread_time()
        out = backend.forward(cache, prompt.view(1, -1), last_only=True, argmax_only=args.argmax_only)
        prompt_cpu = time.thread_time() - start
        logits, steps = [out.logits[-1]], []
        for _ in range(args.tokens):
            start = time.perf_counter()
            out = backend.forward(cache, logits[-1].argmax().view(1, 1), last_only=True, argmax_only=args.argmax_only)
            steps.append(time.perf_counter() - start)
            logits.append(out.logits[-1])
        backend.release(cache)
        return prompt_cpu, steps, torch.stack(logits)

    prompt_s, step_s, reference = ([], []), ([], []), None
    for r in range(args.rounds):
        for i in ((0, 1) if r % 2 == 0 else (1, 0)):
            cpu, steps, logits = run(backends[i])
            if reference is None:
                reference = logits
            if not torch.equal(logits, reference):
                sys.exit(f"round {r}: the {'AB'[i]} build's logits differ from the first round's")
            prompt_s[i].append(cpu)
            step_s[i].extend(steps)
    result = {"variant": args.variant, "distance": args.distance if args.variant == "prefetch" else None,
              "rounds": args.rounds, "tokens": args.tokens, "argmax_only": args.argmax_only,
              "threads": torch.get_num_threads(),
              "logits_bit_identical": True}
    for i, name in enumerate(("A", "B")):
        result[name] = {"prompt_cpu_s_median": statistics.median(prompt_s[i]), "prompt_cpu_s": prompt_s[i],
                        "step_s_median": statistics.median(step_s[i]) if step_s[i] else None,
                        "step_s_min": min(step_s[i]) if step_s[i] else None}
    print(json.dumps(result, indent=2))
    if args.out_json:
        Path(args.out_json).write_text(json.dumps(result, indent=2), encoding="utf-8")


if __name__ == "__main__":
    main()
