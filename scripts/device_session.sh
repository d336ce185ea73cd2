#!/usr/bin/env bash
# One device call for a whole session: the full GPU parity suite, then each issue's own device
# script (scripts/device_<area>.sh BUILD OUT), each under its own time limit so that one stuck
# stage cannot eat the others' time. Nothing is built here: BUILD is a carried build folder
# (bin/ and lib/). Every stage's output lands in a work folder packed into OUT/results.tgz after
# each stage (a device call returns few files, and a call cut off by its limit keeps what the
# earlier stages wrote); OUT/summary.txt has one line per stage.
#
#   scripts/device_session.sh BUILD OUT [AREA[:SECONDS[:STAGE,STAGE...]] ...]
#     default: parity:120 moe:100:train,hf generation:90:cuda,tb,bench fsdp:80 reliability:60 cp:20:bench
#   (the areas' own parity stages are left out by default: the full suite ran first)
# Environment: PEER (the PyTorch peer script, passed on to the area scripts).
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: scripts/device_session.sh BUILD OUT [AREA[:SECONDS[:STAGE,...]] ...]"
build=$(cd "${1:?$usage}" && pwd)
final=${2:?$usage}
shift 2
areas=${*:-parity:120 moe:100:train,hf generation:90:cuda,tb,bench fsdp:80 reliability:60 cp:20:bench}
mkdir -p "$final"
work=${WORK_DIR:-/tmp/device_session}
rm -rf "$work" && mkdir -p "$work"
pack() { tar czf "$final/results.tgz" -C "$work" . 2>/dev/null; cp "$work/summary.txt" "$final/" 2>/dev/null; }
export LD_LIBRARY_PATH="$build/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MEGADLM_BIN=$build/bin NCCL_NVLS_ENABLE=0
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv
  ldd "$build/lib/libmegadlm.so" | grep -E "cudnn|cublas|nccl|cudart|not found"
} > "$work/machine.txt" 2>&1
: > "$work/summary.txt"
for item in $areas; do
  IFS=: read -r area limit stages <<< "$item"
  limit=${limit:-120}
  start=$(date +%s)
  case $area in
    parity)
      # Every GPU parity test of the build (kernels of every issue, whole training steps).
      timeout "$limit" "$build/bin/gpu_parity" --gtest_output="xml:$work/gpu_parity.xml" \
        > "$work/gpu_parity.log" 2>&1
      rc=$?
      result=$(grep -E "^\[  PASSED  \]|^\[  FAILED  \]|tests? ran" "$work/gpu_parity.log" | tr '\n' ' ')
      ;;
    *)
      script=$root/scripts/device_$area.sh
      if [ ! -f "$script" ]; then
        echo "$area: skipped (no scripts/device_$area.sh)" >> "$work/summary.txt"
        continue
      fi
      mkdir -p "$work/$area"
      # shellcheck disable=SC2086
      timeout "$limit" bash "$script" "$build" "$work/$area" ${stages//,/ } > "$work/$area.log" 2>&1
      rc=$?
      result=$(tail -n 3 "$work/$area.log" | tr '\n' ' ')
      ;;
  esac
  echo "$area: rc=$rc in $(( $(date +%s) - start )) s (limit $limit): $result" >> "$work/summary.txt"
  pack
done
cat "$work/summary.txt"
pack
