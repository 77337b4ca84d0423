#!/usr/bin/env bash
# Builds the kjit wheel from this checkout (scikit-build-core, as `pip install .` does), installs it
# into a fresh virtual environment that has nothing else of kjit's, and runs the Python suite there.
# Tests that need torch or a GPU skip visibly (pytest -rs lists them); then
# tests/package/pip_nvrtc_test.sh runs the installed kjit on pip's nvidia-cuda-nvrtc alone. Needs
# PyPI for scikit-build-core and pytest.
#
#   tests/python/run_wheel_tests.sh WORK_DIR [pytest args...]
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=${1:?usage: run_wheel_tests.sh WORK_DIR [pytest args...]}
shift
rm -rf "$work/venv-build" "$work/venv-test" "$work/dist"
mkdir -p "$work"
python3 -m venv "$work/venv-build"
"$work/venv-build/bin/pip" install -q --disable-pip-version-check "scikit-build-core>=0.10"
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2}
"$work/venv-build/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps \
  -w "$work/dist" "$src"
python3 -m venv "$work/venv-test"
"$work/venv-test/bin/pip" install -q --disable-pip-version-check pytest
"$work/venv-test/bin/pip" install -q --disable-pip-version-check --no-deps --no-index \
  "$work"/dist/kjit-*.whl
cd "$work"
"$work/venv-test/bin/python" -m pytest -rs -q -p no:cacheprovider "$src/tests/python" "$@"
# Then pip's NVRTC alone, found by `python -m kjit` and the console scripts (skipped, saying why,
# without PyPI or a mount namespace).
rc=0
"$src/tests/package/pip_nvrtc_test.sh" "$work/pip-nvrtc" python "$work/venv-test/bin/python" ||
  rc=$?
[ "$rc" = 0 ] || [ "$rc" = 77 ] || exit "$rc"
