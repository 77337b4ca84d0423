#!/usr/bin/env bash
# Runs on the lent GPU machine: the cross-entropy kernels' row layouts (CeLayout's head, vectors and
# tail; issue 38's odd vocabularies) and the loss head's extras (issue 35), then the fused
# cross-entropy timed before and after at odd and aligned vocabularies, in one call.
#  1. the GPU tests of both ops, the C API and the sharded op (FILTER overrides);
#  2. memcheck and racecheck on the misaligned-row and rescale tests;
#  3. `kjit bench --op cross_entropy` at 50257, 32001 and 128256 x 16384 rows with the previous
#     build (bin/kjit-base, if bundled) and this one, each beside the copy it measures.
# Build and bundle here first:
#   scripts/package/device-bundle build/tools/kjit build/tests/kjit_gpu_tests
#   cp <the previous build>/tools/kjit .device-bundle/bin/kjit-base   # optional
# then, through the device tool, with carry [".device-bundle"]: bash scripts/gpu/cross-entropy-rows.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle
export KJIT_CACHE_DIR=${KJIT_CACHE_DIR:-/tmp/kjit-cache-rows}
status=0
gpu_info "$out/gpu.txt" name,driver_version,clocks.sm csv,noheader
echo "== GPU tests"
timeout "${TEST_TIMEOUT:-300}" "$bin/kjit_gpu_tests" \
  --gtest_filter="${FILTER:-CrossEntropyGpu.*:*ShardedCrossEntropy*:*Capi*CrossEntropy*:LinearCrossEntropyGpu.*}" \
  > "$out/rows-tests.log" 2>&1 || status=1
grep -E '^\[ +(FAILED|PASSED|SKIPPED) +\]|tests ran' "$out/rows-tests.log" | head -30
if [ $status != 0 ]; then
  echo "last started: $(grep '^\[ RUN' "$out/rows-tests.log" | tail -1)"
  grep -A12 Failure "$out/rows-tests.log" | head -60
fi
if [ "${SANITIZE:-1}" = 1 ]; then
  for tool in memcheck racecheck; do
    timeout 150 "$(compute_sanitizer)" --tool $tool --error-exitcode 3 "$bin/kjit_gpu_tests" \
      --gtest_filter='CrossEntropyGpu.StridedAndMisalignedViewsSplitIntoHeadVectorsAndTail:CrossEntropyGpu.RescaleGradientPerRowLeavesEqualRowsAndNanOnlyItsRow' \
      --gtest_brief=1 > "$out/rows-$tool.log" 2>&1
    rc=$?; echo "$tool exit $rc: $(tail -1 "$out/rows-$tool.log")"; [ $rc = 0 ] || status=1
  done
fi
if [ "${BENCH:-1}" = 1 ]; then
  bench=$(mktemp -d)  # returned as one archive: the device tool brings back at most 8 files
  for vocab in 50257 32001 128256; do
    for which in kjit-base kjit; do
      [ -x "$bin/$which" ] || continue
      echo "== $which: cross_entropy $vocab x 16384"
      timeout 100 "$bin/$which" bench --op cross_entropy --vocab $vocab --rows 16384 \
        --output "$bench/ce-$vocab-$which.json" > "$bench/ce-$vocab-$which.txt" 2>&1 || status=1
      tail -8 "$bench/ce-$vocab-$which.txt"
    done
  done
  tar czf "$out/bench-cross-entropy.tgz" -C "$bench" .
fi
exit $status
