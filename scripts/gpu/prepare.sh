#!/usr/bin/env bash
# Prepares, on this (CPU) machine, everything scripts/gpu/verify.sh carries to the GPU machine,
# which has no Abseil, no compiler for kjit and no package registry:
#   .device-bundle/  kjit_gpu_tests, kjit, kjit-tune and the Hopper GEMM harness with the shared
#                    libraries they need (scripts/package/device-bundle), and COMMIT: the commit
#                    they were built from ("-dirty" when the tree had changes);
#   .device-wheel/   the kjit wheel of the same tree (scripts/package/build-wheel.sh);
#   .whl/            the Python packages the GPU machine lacks for the TRL tests (pinned below);
#   .device-cache/   kernels.tgz: the C++ GPU suite's kernels, compiled here (the compile-only pass):
#                    the suite runs under a libcuda stand-in (tests/gpu/stand_in_driver.c: one H100
#                    that launches nothing), its tests fail by design, and the programs they built
#                    stay in the cache, which verify.sh seeds its own with. An entry is keyed by its
#                    source, NVRTC's version and the target, so a program the GPU machine builds
#                    differently is simply a miss. At most KERNEL_PASS_S seconds (default 1200).
#                    A kernels.tgz already there (one a GPU run returned, copied there) is kept:
#                    the pass adds to it.
#
#   scripts/gpu/prepare.sh [--no-wheel] [--no-kernels]
#
# Then call the device tool with carry [".device-bundle", ".device-wheel", ".whl", ".device-cache"]
# and the command `bash scripts/gpu/verify.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheel=1 kernels=1
for arg in "$@"; do
  case $arg in
    --no-wheel) wheel=0 ;;
    --no-kernels) kernels=0 ;;
    *) echo "prepare: unknown argument '$arg' (--no-wheel, --no-kernels)" >&2; exit 2 ;;
  esac
done
# trl and datasets are not on the GPU machine's image; their other requirements are.
python_wheels=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

[ -f build/CMakeCache.txt ] || cmake -S . -B build
cmake --build build -j"$(nproc)" --target kjit_gpu_tests kjit_cli kjit_tune kjit_stand_in_driver
harness=$(mktemp -d)/gemm_harness
nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -Itemplates -o "$harness" \
  bench/gemm_sm90/harness.cu -lcublasLt -lcuda
scripts/package/device-bundle build/tests/kjit_gpu_tests build/tools/kjit build/tools/kjit-tune "$harness"
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- . ':!bench/results' || commit=$commit-dirty
echo "$commit" > .device-bundle/COMMIT

# The compile-only pass: the suite's shards side by side under the stand-in driver, each capped at
# 4 GiB of stand-in device memory (a test that wants more fails before it compiles).
compile_kernels() {
  local cache shards=$(nproc) start=$SECONDS i
  cache=$(mktemp -d)/kjit
  mkdir -p "$cache" .device-cache
  # What is there already (an earlier pass, or a cache a GPU run returned) is kept and added to.
  [ -f .device-cache/kernels.tgz ] && tar -xzf .device-cache/kernels.tgz -C "$cache" --wildcards '*.kjit'
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i KJIT_CACHE_DIR=$cache \
      KJIT_LIBCUDA_PATH=$PWD/build/tests/libkjit_stand_in_driver.so KJIT_STAND_IN_MEMORY_MIB=4096 \
      timeout "${KERNEL_PASS_S:-1200}" build/tests/kjit_gpu_tests --gtest_filter='*-TuningGpu.*' \
      > /dev/null 2>&1 &
  done
  wait
  (cd "$cache" && find . -maxdepth 1 -name '*.kjit' -print0 | tar -czf - --null -T -) \
    > .device-cache/kernels.tgz
  echo "prepare: compile-only pass: $(find "$cache" -maxdepth 1 -name '*.kjit' | wc -l) programs" \
    "in $((SECONDS - start)) s into .device-cache/kernels.tgz"
  rm -rf "$(dirname "$cache")"
}
[ $kernels = 1 ] && compile_kernels

if [ $wheel = 1 ]; then
  scripts/package/build-wheel.sh --out .device-wheel --build-dir build-python | tail -1
fi
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d .whl "${python_wheels[@]}"
du -shc .device-bundle .device-wheel .whl .device-cache 2>/dev/null
echo "prepare: $commit; carry .device-bundle .device-wheel .whl .device-cache (at most 64 MiB in all)"
