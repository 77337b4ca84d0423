#!/usr/bin/env bash
# The compile-only pass's premise, on a machine without a GPU: with the stand-in driver
# (stand_in_driver.c) a GPU test runs its ops as on a GPU and leaves their programs in the kernel
# cache. Passes when the test did not skip and at least one program was cached.
#
#   tests/gpu/stand_in_driver_test.sh build/tests/kjit_gpu_tests build/tests/libkjit_stand_in_driver.so
set -uo pipefail
tests=${1:?usage: stand_in_driver_test.sh KJIT_GPU_TESTS STAND_IN_DRIVER}
driver=${2:?usage: stand_in_driver_test.sh KJIT_GPU_TESTS STAND_IN_DRIVER}
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
KJIT_LIBCUDA_PATH=$driver KJIT_CACHE_DIR=$cache "$tests" --gtest_filter=CrossEntropyGpu.AllRowsIgnored \
  > "$cache/log" 2>&1
if grep -q '^\[  SKIPPED \]' "$cache/log"; then
  echo "FAIL: the test skipped under the stand-in driver:"; tail -5 "$cache/log"; exit 1
fi
programs=$(find "$cache" -maxdepth 1 -name '*.kjit' | wc -l)
if [ "$programs" -lt 1 ]; then
  echo "FAIL: no program was cached under the stand-in driver:"; tail -20 "$cache/log"; exit 1
fi
echo "PASS: $programs programs cached under the stand-in driver"
