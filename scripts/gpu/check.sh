#!/usr/bin/env bash
# Runs on the lent GPU machine (README.md, "Tests and benchmarks"): the GPU suite, compute-sanitizer on a
# subset, and the benchmark, everything written under $OUT. Build here first and bundle:
#   scripts/package/device-bundle build/tests/kjit_gpu_tests build/tools/kjit
# then, through the device tool, with carry [".device-bundle", ".device-cache"]:
#   bash scripts/gpu/check.sh [gtest-filter]
# and copy the kernels.tgz it returns into .device-cache/ for the next call
# (common.sh's kernel cache).
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle
kernel_cache_start
export KJIT_TUNE_BIN=$bin/kjit-tune  # for KJIT_AUTOTUNE's test
filter=${1:-*}
gpu_info "$out/gpu.txt" name,driver_version,clocks.sm,clocks.mem,temperature.gpu
status=0
echo "== GPU tests"
# Not --gtest_brief: when the timeout cuts the suite short (the whole suite takes over 260 s on the
# H200 with a cold kernel cache), the log still shows which tests ran and which one was running.
# SHARDS=N runs the whole suite as N gtest shards side by side (a cold cache's time is NVRTC
# compiles, on the CPU's cores), then, alone, the tests that read device-wide memory or time
# kjit-tune. A filter runs as one process.
serial='CrossEntropyGpu.AllocatesNothingAndTheWorkspaceIsORows:LinearCrossEntropyGpu.TakesNoMemoryBeyondItsWorkspace:TuningGpu.*:GpuTimerGpu.*'
if [ "${SHARDS:-1}" -gt 1 ] && [ "$filter" = '*' ]; then
  pids=()
  for ((i = 0; i < SHARDS; i++)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout ${TEST_TIMEOUT:-480} "$bin/kjit_gpu_tests" \
      --gtest_filter="*-$serial" > "$out/gpu-tests-shard$i.log" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || status=1; done
  cat "$out"/gpu-tests-shard*.log > "$out/gpu-tests.log" && rm "$out"/gpu-tests-shard*.log
  timeout ${TEST_TIMEOUT:-480} "$bin/kjit_gpu_tests" --gtest_filter="$serial" >> "$out/gpu-tests.log" 2>&1 || status=1
else
  timeout ${TEST_TIMEOUT:-480} "$bin/kjit_gpu_tests" --gtest_filter="$filter" > "$out/gpu-tests.log" 2>&1 || status=1
fi
grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure' "$out/gpu-tests.log" | tail -40
[ $status = 0 ] || echo "GPU tests failed or timed out; the last test started: $(grep '^\[ RUN' "$out/gpu-tests.log" | tail -1)"
kernel_cache_save  # now too: the call's own time limit may end it before the last line
san=$(compute_sanitizer)
if [ -x "$san" ] && [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  for tool in memcheck racecheck; do
    echo "== compute-sanitizer $tool"
    timeout 120 "$san" --tool $tool --error-exitcode 3 "$bin/kjit_gpu_tests" \
      --gtest_filter='RmsNormGpu.MisalignedViewsUseNarrowerVectors:RmsNormGpu.NanRowLeavesOtherRowsFinite:RmsNormGpu.BadInputLaunchesNothing:CrossEntropyGpu.NanRowLeavesOtherRowsFinite:CrossEntropyGpu.BadInputLaunchesNothing:CrossEntropyGpu.RescaleGradientPerRowLeavesEqualRowsAndNanOnlyItsRow:CapiCrossEntropyGpu.*:*CapiRmsNormGpu.*' \
      --gtest_brief=1 > "$out/sanitizer-$tool.log" 2>&1
    rc=$?; tail -5 "$out/sanitizer-$tool.log"; echo "$tool exit $rc"; [ $rc = 0 ] || status=1
  done
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== bench"
  timeout 180 "$bin/kjit" bench --op rms_norm --output "$out/bench-rms_norm.json" || status=1
  timeout 240 "$bin/kjit" bench --op cross_entropy --output "$out/bench-cross_entropy.json" || status=1
fi
kernel_cache_save
exit $status
