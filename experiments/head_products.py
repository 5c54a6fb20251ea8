"""One-row products over an LM head of Qwen3-0.6B's size (151,936 x 1,024, random bfloat16) on the CPU kernels of a
checkout, timed inside C++: the full head (what a pass without the screen reads, 311 MB), its 8-bit copy alone
(quantized.h's Q8_0, 165 MB), the screened argmax (argmax_screen.h: the 8-bit product, the bounds and the exact
candidates), the 4-bit copy (a drafting copy's layers' format, 97 MB), and a plain read of the 8-bit copy's bytes
(two loads a cache line, nothing else) beside them. Each figure is the median and minimum of `--reps` calls, rounds
alternated; GB/s are the bytes over the median.

It builds a copy of the checkout's kernel sources with a module of its own in place of bindings.h, so that it can
time another checkout's kernels (`--kernels other/specdec/kernels`) in this one's process layout:

    python experiments/head_products.py --threads 2 --out-json experiments/results/zen3_head_products.json
    python experiments/head_products.py --kernels /tmp/old/specdec/kernels --threads 1
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROBE = r"""
#pragma once
#include <chrono>
struct HeadProbe {
  Weight full, q8, q4;
  ArgmaxScreen screen;
  explicit HeadProbe(torch::Tensor head)
      : full(make_weight(head.contiguous())), q8(make_quantized_weight(head, 8)), q4(make_quantized_weight(head, 4)),
        screen(make_argmax_screen(head)) {}
  // seconds of each of `reps` calls of one product: full, q8, screen, q4 or read
  std::vector<double> run(torch::Tensor x, std::string what, int reps) {
    const int64_t N = full.N, K = full.K;
    std::vector<float> y(N);
    const float* xp = x.data_ptr<float>();
    std::vector<double> seconds;
    for (int r = 0; r < reps; ++r) {
      const auto start = std::chrono::steady_clock::now();
      if (what == "full") {
        linear(xp, 1, full, nullptr, y.data(), N);
      } else if (what == "q8" || what == "q4") {
        const Q8Rows xq = quantize_rows(xp, 1, K);
        const uint8_t* w = reinterpret_cast<const uint8_t*>(what == "q8" ? q8.data : q4.data);
        if (what == "q8") linear_quantized<8>(xq, 1, w, N, K, nullptr, y.data(), N);
        else linear_quantized<4>(xq, 1, w, N, K, nullptr, y.data(), N);
      } else if (what == "screen") {
        screened_argmax_logits(screen, full, xp, 1, y.data());
      } else {
        const uint8_t* p = reinterpret_cast<const uint8_t*>(q8.data);
        at::parallel_for(0, q8.tensor.numel() / 4096, 1, [&](int64_t a, int64_t b) {
          __m256i acc = _mm256_setzero_si256();
          for (int64_t i = a * 4096; i < b * 4096; i += 64) {
            acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
            acc = _mm256_xor_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 32)));
          }
          y[at::get_thread_num()] = static_cast<float>(_mm256_extract_epi32(acc, 0));
        });
      }
      seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    return seconds;
  }
  std::map<std::string, int64_t> bytes() {
    return {{"full", full.tensor.numel() * full.tensor.element_size()}, {"q8", q8.tensor.numel()},
            {"screen", q8.tensor.numel()}, {"read", q8.tensor.numel()}, {"q4", q4.tensor.numel()}};
  }
};
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  pybind11::class_<HeadProbe>(m, "HeadProbe", pybind11::module_local())
      .def(pybind11::init<torch::Tensor>())
      .def("run", &HeadProbe::run, pybind11::call_guard<pybind11::gil_scoped_release>())
      .def("bytes", &HeadProbe::bytes);
}
"""
PRODUCTS = ("full", "q8", "screen", "q4", "read")


def build(kernels: Path, into: Path):
    """The probe module on `kernels`' sources, compiled with the flags specdec.kernels uses."""
    import torch  # noqa: F401  (before the extension)
    from torch.utils import cpp_extension

    import specdec.kernels as ours
    for path in kernels.iterdir():
        if path.suffix in (".h", ".cpp"):
            shutil.copy(path, into / path.name)
    (into / "bindings.h").write_text(PROBE)
    source = (into / "cpu_llama.cpp").read_text()
    (into / "cpu_llama.cpp").write_text(source.replace("#include <vector>", "#include <map>\n#include <vector>"))
    tag = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(into.iterdir()))).hexdigest()[:10]
    return cpp_extension.load(name=f"head_probe_{tag}", sources=[str(into / "cpu_llama.cpp")],
                              build_directory=str(into), extra_cflags=["-O3", *ours.build_flags(ours.instruction_set()),
                                                                       "-ffp-contract=off", "-fopenmp"],
                              extra_ldflags=ours._openmp_link_flags())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kernels", type=Path, default=ROOT / "specdec" / "kernels")
    parser.add_argument("--threads", type=int, default=None, help="torch's intra-op threads (default: as set)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument("--out-json", type=Path)
    args = parser.parse_args()

    import torch

    from specdec.benchmarks.runner import machine_info
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        probe_module = build(args.kernels.resolve(), Path(tmp))
        head = (torch.randn(151936, 1024, generator=torch.Generator().manual_seed(0)) * 0.02).to(torch.bfloat16)
        probe = probe_module.HeadProbe(head)
        x = torch.randn(1024, generator=torch.Generator().manual_seed(1))
        seconds = {name: [] for name in PRODUCTS}
        for _ in range(args.rounds):
            for name in PRODUCTS:
                seconds[name] += probe.run(x, name, args.reps)
        sizes = probe.bytes()
    products = {name: {"median_ms": statistics.median(s) * 1e3, "min_ms": min(s) * 1e3, "bytes": sizes[name],
                       "gb_per_s": sizes[name] / statistics.median(s) / 1e9} for name, s in seconds.items()}
    result = {"kernels": str(args.kernels), "threads": torch.get_num_threads(), "machine": machine_info(),
              "products": products}
    for name, figures in result["products"].items():
        print(f"{name:7s} median {figures['median_ms']:6.2f} ms  min {figures['min_ms']:6.2f} ms  "
              f"{figures['bytes'] / 1e6:6.1f} MB  {figures['gb_per_s']:5.1f} GB/s")
    if args.out_json:
        args.out_json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
