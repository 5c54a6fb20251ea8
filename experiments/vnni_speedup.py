"""The quantized copy's drafting with and without AVX-512 VNNI, beside plain decoding, alternated prompt by prompt in
one process (so that a busy spell on a shared machine falls on all three): what vpdpbusd buys the default drafter
on a CPU that has it. Both copies come from the same source; the one without VNNI is built as for a CPU that lacks it
(its 16-bit pair sums give the same integers, so both propose the same drafts).

    python experiments/vnni_speedup.py --prompts ../shared/data/specbench_dev.jsonl --limit 26 \\
        --out-json experiments/results/zen4_vnni_copy.json
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from alternate import ab_arguments, copy_ab, named_copy

    args = ab_arguments(__doc__.split("\n\n")[0])
    import specdec.kernels as kernels

    if "-mavx512vnni" not in kernels.build_flags(kernels.instruction_set() or "avx2"):
        sys.exit("this CPU has no AVX-512 VNNI: nothing to compare")
    from specdec.engine import SpecDecoder
    from specdec.models.kernel_llama import kernel_model_args

    decoder = SpecDecoder.load(drafter="quantized", dtype=args.dtype)
    backend = decoder.target.backend
    with_vnni = kernels.load()
    flags = kernels.build_flags
    kernels.build_flags = lambda isa: list(kernels.BUILD_FLAGS[isa])  # as on a CPU without VNNI
    without_vnni = kernels._build.__wrapped__("avx512")
    kernels.build_flags = flags
    model_args = kernel_model_args(backend._hf_model, backend.max_context)
    drafters = {name: named_copy(backend, module.CpuLlama(*model_args, False, True, False), f"quantized_{name}")
                for name, module in (("vnni", with_vnni), ("no_vnni", without_vnni))}
    result = copy_ab(args, decoder, drafters)
    speedup, totals = result["speedup_over_none"], result["methods"]
    print(f"quantized copy with VNNI {speedup['vnni']:.2f}x plain decoding, without {speedup['no_vnni']:.2f}x "
          f"(drafting {totals['vnni']['draft_s']:.1f} s against {totals['no_vnni']['draft_s']:.1f} s); "
          f"{result['equal_to_plain']}/{result['prompts']} equal")


if __name__ == "__main__":
    main()
