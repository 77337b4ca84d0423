#!/usr/bin/env bash
# Prepares, on this (CPU) machine, everything scripts/gpu/verify.sh carries to the GPU machine,
# which has no Abseil, no compiler for kjit and no package registry:
#   .device-bundle/  kjit_gpu_tests, kjit, kjit-tune and the Hopper GEMM harness with the shared
#                    libraries they need (scripts/device-bundle), and COMMIT: the commit they were
#                    built from ("-dirty" when the tree had changes);
#   .device-wheel/   the kjit wheel of the same tree (scripts/build-wheel.sh);
#   .whl/            the Python packages the GPU machine lacks for the TRL tests (pinned below).
# A kernel cache returned by an earlier run (kernels.tgz) goes into .device-cache/ by hand.
#
#   scripts/gpu/prepare.sh [--no-wheel]
#
# Then call the device tool with carry [".device-bundle", ".device-wheel", ".whl", ".device-cache"]
# and the command `bash scripts/gpu/verify.sh`.
set -euo pipefail
cd "$(dirname "$0")/../.."
wheel=1
case ${1:-} in
  --no-wheel) wheel=0 ;;
  "") ;;
  *) echo "prepare: unknown argument '$1' (--no-wheel or nothing)" >&2; exit 2 ;;
esac
# trl and datasets are not on the GPU machine's image; their other requirements are.
python_wheels=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19)

[ -f build/CMakeCache.txt ] || cmake -S . -B build
cmake --build build -j"$(nproc)" --target kjit_gpu_tests kjit_cli kjit_tune
harness=$(mktemp -d)/gemm_harness
nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -Itemplates -o "$harness" \
  bench/gemm_sm90/harness.cu -lcublasLt -lcuda
scripts/device-bundle build/tests/kjit_gpu_tests build/tools/kjit build/tools/kjit-tune "$harness"
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- . ':!bench/results' || commit=$commit-dirty
echo "$commit" > .device-bundle/COMMIT

if [ $wheel = 1 ]; then
  scripts/build-wheel.sh --out .device-wheel --build-dir build-python | tail -1
fi
mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform any -d .whl "${python_wheels[@]}"
du -shc .device-bundle .device-wheel .whl .device-cache 2>/dev/null
echo "prepare: $commit; carry .device-bundle .device-wheel .whl .device-cache (at most 64 MiB in all)"
