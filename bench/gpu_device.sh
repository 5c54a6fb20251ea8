#!/usr/bin/env bash
# On the GPU machine (no internet), from the repository root: the device side of bench/gpu_prepare.sh.
#   bash bench/gpu_device.sh stash   keeps the payload files this call carried (gpu-payload/*) in /root/specdec-payload
#   bash bench/gpu_device.sh run     the same, then joins the wheel's parts into /root, checks its sha256, and runs
#                                    bench/gpu_check.sh with SPECDEC_MODEL_WHEEL set; the results are copied to $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
keep=${SPECDEC_PAYLOAD_DIR:-/root/specdec-payload}
mkdir -p "$keep"
if compgen -G "gpu-payload/*" >/dev/null; then
  cp gpu-payload/* "$keep"/
fi
echo "kept in $keep: $(cd "$keep" && ls | tr '\n' ' ')"
[[ ${1:-stash} == run ]] || exit 0

# shellcheck source=/dev/null
source "$keep/payload.env"
parts=("$keep"/wheel.part-*)
if ((${#parts[@]} != PARTS)); then
  echo "gpu_device.sh: $keep holds ${#parts[@]} of the wheel's $PARTS parts: carry the missing ones first" >&2
  exit 2
fi
wheel=${SPECDEC_WHEEL_DIR:-/root}/$WHEEL_NAME
cat "${parts[@]}" >"$wheel"
echo "$WHEEL_SHA256  $wheel" | sha256sum -c -
export SPECDEC_MODEL_WHEEL="$wheel" SPECDEC_COMMIT="$COMMIT"
rc=0
bash bench/gpu_check.sh "$keep/prompts.jsonl" || rc=$?
if [[ -n ${OUT:-} ]]; then
  cp -r bench/results/gpu/. "$OUT"/
  echo "results copied to \$OUT: $(cd "$OUT" && ls)"
fi
exit $rc
