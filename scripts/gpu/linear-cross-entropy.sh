#!/usr/bin/env bash
# Runs on the lent GPU machine (README.md, "Tests and benchmarks"): the fused linear + cross-entropy's GPU
# tests (C++ and C API), compute-sanitizer on its small cases, `kjit bench --op
# linear_cross_entropy` (the standard set beside the GEMMs alone, the unfused path and the loss
# kernel; then, with SWEEP=1, the configs around the heuristic's at 8192 rows), a tuning run of the
# op at 8192 rows, and the fine-tuning harness whose kjit path is the op. Everything under $OUT.
# Build here first and bundle (cuBLASLt is the GPU machine's own CUDA 13's):
#   cmake --build build --target kjit_gpu_tests kjit_cli kjit_tune finetune_step
#   scripts/package/device-bundle build/tests/kjit_gpu_tests build/tools/kjit build/tools/kjit-tune \
#     build/bench/finetune_step/finetune_step
# then, through the device tool, with carry [".device-bundle", ".device-cache"]:
#   bash scripts/gpu/linear-cross-entropy.sh
# and copy the kernels.tgz it returns into .device-cache/ for the next call
# (common.sh's kernel cache).
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle --toolkit
export KJIT_TUNING_DB=$(mktemp -d)/tuning.json
kernel_cache_start
status=0
gpu_info "$out/gpu.txt" name,driver_version,clocks.sm,clocks.mem,temperature.gpu
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  echo "== GPU tests"
  timeout 300 "$bin/kjit_gpu_tests" --gtest_filter='LinearCrossEntropyGpu.*:*CapiLinearCrossEntropyGpu*' \
    > "$out/gpu-tests.log" 2>&1 || status=1
  grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|device memory taken|worst' "$out/gpu-tests.log" | tail -30
  echo "== compute-sanitizer memcheck"
  timeout 200 "$(compute_sanitizer)" --tool memcheck --error-exitcode 3 "$bin/kjit_gpu_tests" \
    --gtest_filter='LinearCrossEntropyGpu.ForwardOnly:LinearCrossEntropyGpu.WeightGradientAccumulation:LinearCrossEntropyGpu.OddShapesOneRowAndAllIgnored:LinearCrossEntropyGpu.RescaleGradientsFollowTheFormulaBitForBit' \
    --gtest_brief=1 > "$out/sanitizer-memcheck.log" 2>&1
  rc=$?; tail -3 "$out/sanitizer-memcheck.log"; echo "memcheck exit $rc"; [ $rc = 0 ] || status=1
  kernel_cache_save  # now too: the call's own time limit may end it before the last line
fi
echo "== bench"
timeout 300 "$bin/kjit" bench --op linear_cross_entropy --output "$out/bench-linear_cross_entropy.json" || status=1
if [ "${SWEEP:-0}" = 1 ]; then
  timeout 200 "$bin/kjit" bench --op linear_cross_entropy --rows 8192 --sweep \
    --output "$out/bench-linear_cross_entropy-sweep.json" > "$out/sweep.txt" || status=1
  sort -t' ' -k1,1 "$out/sweep.txt" | tail -40
fi
if [ "${TUNE:-0}" = 1 ]; then
  echo "== kjit-tune"
  spec='{"op":"linear_cross_entropy","vocab":128256,"hidden":4096,"dtype":"bf16","target_type":"int64","ignore_index":-100,"reduction":"mean","label_smoothing":0,"lse_square_scale":0,"softcap":0,"argmax":false,"bias":false,"weight_grad_dtype":"bf16","weight_grad_accumulation":"fp32"}'
  ( time timeout 300 "$bin/kjit-tune" --spec "$spec" --tokens 8192 --json > "$out/tune.json" ) 2>&1 | tail -5 || status=1
  timeout 120 "$bin/kjit" bench --op linear_cross_entropy --rows 8192 --output "$out/bench-tuned.json" | tail -3 || status=1
fi
if [ "${FINETUNE:-0}" = 1 ]; then
  echo "== finetune_step"
  timeout 200 "$bin/finetune_step" --json > "$out/finetune.json" 2> "$out/finetune.txt" || status=1
  tail -12 "$out/finetune.txt"
fi
kernel_cache_save
exit $status
