#!/usr/bin/env bash
# Runs on the lent GPU machine (README.md, "Tests and benchmarks"): installs the kjit wheel carried in
# .device-wheel/ into a private environment over the system's packages (common.sh's wheel_env; the
# log in $OUT/python-install.log), runs the Python suite with its GPU tests, then
# `python -m kjit.bench`, writing the logs and the JSON under $OUT. Build the wheel here first:
#   pip wheel --no-build-isolation --no-deps -w .device-wheel .      (or tests/python/run_wheel_tests.sh)
# then, through the device tool, with carry [".device-wheel", ".device-cache"]: bash scripts/gpu/python.sh
# and copy the kernels.tgz it returns into .device-cache/ for the next call
# (common.sh's kernel cache).
# PYTEST_ARGS adds pytest arguments (-k ...); SKIP_BENCH=1 skips the benchmark; BENCH_ARGS replaces
# its default cases (e.g. "--case extras:16384x128256 --case hf:4x2048").
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
wheel_env "$out/python-install.log" || exit 1
export PYTHONUNBUFFERED=1
kernel_cache_start
status=0
# shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
timeout "${PYTEST_TIMEOUT:-420}" "$python" -m pytest -rs -q -p no:cacheprovider tests/python ${PYTEST_ARGS:-} 2>&1 |
  tee "$out/pytest.log" || status=1
kernel_cache_save  # now too: the call's own time limit may end it before the last line
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
  timeout "${BENCH_TIMEOUT:-300}" "$python" -m kjit.bench --json "$out/bench-python.json" \
    ${BENCH_ARGS:-} 2>&1 |
    tee "$out/bench-python.log" || status=1
fi
kernel_cache_save
exit $status
