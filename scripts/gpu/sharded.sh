#!/usr/bin/env bash
# Issue 8 on the lent GPU machine: the vocab-parallel cross-entropy's GPU tests (shards in turn on
# one GPU, the host-side all-reduce steps, NCCL with one rank), the multi-process NCCL program for
# 2 and 4 ranks (it skips, saying so, with fewer GPUs), 8 ranks starting together on an empty shared
# cache (all on GPU 0 here; one a GPU where there are 8), and the benchmark. Everything lands under
# $OUT. Build here first and bundle:
#   cmake --build build-shard -j1 --target kjit_gpu_tests kjit_sharded_nccl_ranks \
#     kjit_shared_cache_ranks kjit_bench_sharded
#   scripts/package/device-bundle build-shard/tests/kjit_gpu_tests \
#     build-shard/tests/kjit_sharded_nccl_ranks build-shard/tests/kjit_shared_cache_ranks \
#     build-shard/tools/kjit-bench-sharded
#   strip --strip-unneeded .device-bundle/bin/*     # 67 MiB with debug info, 4 MiB without
# then, through the device tool, with carry [".device-bundle"]:
#   bash scripts/gpu/sharded.sh
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle
fresh_kernel_cache
no_nvlink_multicast
# NCCL is not bundled (200 MB): take the machine's, from the CUDA install, the loader's cache or the
# nvidia-nccl wheel PyTorch uses.
if [ -z "${KJIT_NCCL_LIBRARY:-}" ]; then
  KJIT_NCCL_LIBRARY=$( (ls /usr/local/cuda/lib*/libnccl.so.2 2>/dev/null;
    ldconfig -p | awk '/libnccl\.so\.2 /{print $NF}';
    python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib/libnccl.so.2"))' 2>/dev/null
  ) | while read -r f; do [ -f "$f" ] && echo "$f" && break; done)
  [ -n "$KJIT_NCCL_LIBRARY" ] && export KJIT_NCCL_LIBRARY
fi
gpu_info "$out/gpu.txt" name,driver_version,clocks.sm,clocks.mem
echo "NCCL: ${KJIT_NCCL_LIBRARY:-not found}" | tee -a "$out/gpu.txt"
status=0
echo "== GPU tests (sharded cross-entropy)"
timeout ${TEST_TIMEOUT:-420} "$bin/kjit_gpu_tests" --gtest_filter='ShardedCrossEntropyGpu.*' 2>&1 \
  | tee "$out/sharded-gpu-tests.log" | grep -E '^\[|checked|NCCL|SKIP|Failure|Expected|Which|vs' | tail -60 || status=1
if [ "${SKIP_UNSHARDED:-0}" != 1 ]; then
  echo "== GPU tests (unsharded cross-entropy: cross_entropy.cuh's shared pieces were factored out)"
  timeout ${TEST_TIMEOUT:-420} "$bin/kjit_gpu_tests" --gtest_filter='CrossEntropyGpu.*' --gtest_brief=1 2>&1 \
    | tee "$out/unsharded-gpu-tests.log" | tail -15 || status=1
fi
echo "== NCCL, one process per GPU"
for n in 2 4; do
  timeout 300 "$bin/kjit_sharded_nccl_ranks" --ranks $n 2>&1 | tee -a "$out/nccl-ranks.log"
  rc=${PIPESTATUS[0]}; echo "ranks $n exit $rc"; [ $rc = 0 ] || [ $rc = 77 ] || status=1
done
echo "== 8 ranks, one shared cache"
gpus=$(nvidia-smi -L | wc -l)
timeout 300 "$bin/kjit_shared_cache_ranks" --ranks 8 --gpus "$gpus" --json "$out/shared-cache-ranks.json" \
  > "$out/shared-cache-ranks.log" 2>&1 || status=1
grep -E 'rank0_ms|slowest_ms|compiled_once|nvrtc_compiles|cache_entries|FAIL' "$out/shared-cache-ranks.log"
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  echo "== benchmark"
  timeout 300 "$bin/kjit-bench-sharded" --output "$out/bench-sharded.json" > "$out/bench-sharded.log" 2>&1 || status=1
  grep -E '"(op|ways|median_us|gbps|ratio_to_copy|ratio_to_copy_of_min_bytes|speedup_vs_unsharded)"' "$out/bench-sharded.log" || tail -5 "$out/bench-sharded.log"
fi
exit $status
