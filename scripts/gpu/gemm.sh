#!/usr/bin/env bash
# Runs on the lent GPU machine: kjit's Hopper GEMM (templates/gemm_sm90.cuh) checked and timed.
#  1. bench/gemm_sm90/harness.cu, built here with nvcc (the template compiled in directly), first on
#     small odd shapes against an fp64 reference (every layout and config, NaN-poisoned outputs),
#     then the lm_head's three GEMMs at 4096/8192/16384 rows against cuBLASLt's best heuristic
#     algorithm, elementwise, and timed with a flushed L2;
#  2. compute-sanitizer memcheck and racecheck on the small shapes;
#  3. `kjit bench --op linear_cross_entropy --sweep` at 8192 rows: kjit's GEMM compiled through
#     NVRTC beside every cuBLASLt algorithm, and the fused op on kjit's GEMMs checked against the
#     unfused reference before it is timed.
# Build here first:
#   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -Itemplates \
#     -o .device-bundle/bin/gemm_harness bench/gemm_sm90/harness.cu -lcublasLt -lcuda
#   (after scripts/package/device-bundle build/tools/kjit build/tests/kjit_gpu_tests)
# then, through the device tool, with carry [".device-bundle"]: bash scripts/gpu/gemm.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle --toolkit
status=0
gpu_info "$out/gpu.txt" name,driver_version,clocks.sm,clocks.max.sm,power.draw
echo "== harness: small shapes against fp64"
timeout 120 "$bin/gemm_harness" quick > "$out/gemm-quick.log" 2>&1 || status=1
grep -E "FAIL|correctness" "$out/gemm-quick.log" | tail -8
echo "== harness: the lm_head's GEMMs against cuBLASLt"
timeout 300 "$bin/gemm_harness" > "$out/gemm-full.log" 2>&1 || status=1
grep -vE "^  L" "$out/gemm-full.log" | tail -45
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 200 "$(compute_sanitizer)" --tool $tool --error-exitcode 3 "$bin/gemm_harness" quick \
      > "$out/gemm-$tool.log" 2>&1
    rc=$?; echo "$tool exit $rc: $(tail -1 "$out/gemm-$tool.log")"; [ $rc = 0 ] || status=1
  done
fi
if [ -x "$bin/kjit" ] && [ "${BENCH:-1}" = 1 ]; then
  echo "== kjit bench --sweep (8192 rows)"
  timeout 240 "$bin/kjit" bench --op linear_cross_entropy --rows 8192 --sweep \
    --output "$out/bench-lce-sweep.json" > "$out/sweep.txt" 2>&1 || status=1
  grep -E "kjit|gemm|fused|unfused" "$out/sweep.txt" | head -40
fi
exit $status
