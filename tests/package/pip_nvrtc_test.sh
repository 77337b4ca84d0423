#!/usr/bin/env bash
# kjit on pip's CUDA alone (issue 33): installs nvidia-cuda-nvrtc from PyPI into a virtual
# environment, hides every other libnvrtc from the loader, and compiles kernels with it. pip's
# libnvrtc has no RUNPATH, so it finds its libnvrtc-builtins only because kjit loads them from
# beside it; without that every compile fails with "failed to open libnvrtc-builtins.so.13.0".
#
#   tests/package/pip_nvrtc_test.sh WORK_DIR kjit PATH_TO_KJIT
#   tests/package/pip_nvrtc_test.sh WORK_DIR python PATH_TO_PYTHON
#
# `kjit`: that program, with KJIT_NVRTC_PATH at pip's libnvrtc in a virtual environment of its own
# (WORK_DIR/venv). `python`: the interpreter of a virtual environment with the kjit wheel
# installed; nvidia-cuda-nvrtc goes into it, and `python -m kjit` and its `kjit` console script
# must find it with no variable set. Each compiles cross_entropy (vocab 128256) for sm_90 and
# sm_100 into an empty cache, and `doctor --arch sm_90,sm_100` must find NVRTC and compile for both.
#
# The system's NVRTC is hidden by binding /dev/null over each libnvrtc* file the loader knows, in a
# private mount namespace (`unshare -m -r`). Where user namespaces are not allowed, `kjit` mode
# runs with the system's NVRTC visible and `python` mode (which would rightly prefer the system's)
# is skipped. Either way the loader's trace (LD_DEBUG=files) must show libnvrtc and its builtins
# opened from the virtual environment only. Exits 77 (skipped, saying why) when PyPI cannot be
# reached; pip's own cache keeps the download.
set -euo pipefail
usage="usage: pip_nvrtc_test.sh WORK_DIR kjit|python PATH"
work=${1:?$usage}
mode=${2:?$usage}
program=${3:?$usage}
[[ "$mode" == kjit || "$mode" == python ]] || { echo "$usage (got mode '$mode')" >&2; exit 2; }
nvrtc_requirement="nvidia-cuda-nvrtc==13.0.*"
mkdir -p "$work"
work=$(cd "$work" && pwd)

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# pip install into the environment of interpreter $1, or exit 77 when PyPI cannot be reached.
install_nvrtc() {
  local log="$work/pip-install.log"
  if ! "$1" -m pip install -q --disable-pip-version-check "$nvrtc_requirement" >"$log" 2>&1; then
    echo "SKIP: cannot install $nvrtc_requirement from PyPI (no network?):" >&2
    tail -n 3 "$log" >&2
    exit 77
  fi
}

# The lib folder of nvidia-cuda-nvrtc in the environment of interpreter $1.
pip_nvrtc_dir() {
  "$1" - <<'EOF'
import glob, sys
for base in sys.path:
    for lib in glob.glob(base + "/nvidia/cu13/lib/libnvrtc.so.13"):
        print(lib.rsplit("/", 1)[0])
        sys.exit(0)
sys.exit("nvidia-cuda-nvrtc is installed but its nvidia/cu13/lib/libnvrtc.so.13 was not found")
EOF
}

if [ "$mode" = kjit ]; then
  [ -x "$work/venv/bin/python" ] || python3 -m venv "$work/venv"
  python="$work/venv/bin/python"
else
  python=$program
fi
install_nvrtc "$python"
nvrtc_dir=$(pip_nvrtc_dir "$python")

# Every libnvrtc* the loader could find outside the environment: ldconfig's, and the toolkit's.
others=$( (ldconfig -p | awk '/libnvrtc/ {print $NF}'; ls /usr/local/cuda/lib64/libnvrtc* 2>/dev/null) |
  xargs -r -n1 readlink -f | sort -u | grep -v "^$nvrtc_dir/" | tr '\n' ' ' || true)
hide=()
if unshare -m -r true 2>/dev/null; then
  hide=(unshare -m -r bash -c 'for f in $HIDDEN_NVRTC; do mount --bind /dev/null "$f"; done; exec "$@"' hide)
  echo "hiding the system's NVRTC in a mount namespace: $others"
elif [ "$mode" = python ]; then
  echo "SKIP: no mount namespace here (unshare -m -r failed) to hide the system's NVRTC, which" \
    "python -m kjit would rightly prefer to pip's" >&2
  exit 77
else
  echo "note: no mount namespace here (unshare -m -r failed): the system's NVRTC stays visible, and" \
    "only the loader's trace shows that it was not used"
fi

# Runs "$@" with the system's NVRTC hidden and an empty cache, under the loader's trace, into
# WORK_DIR/out-NAME; checks that every libnvrtc* opened came from the environment, and returns the
# program's exit code.
run_checked() {
  local name=$1
  shift
  local trace="$work/trace-$name" rc=0
  rm -rf "$work/cache-$name" "$trace".*
  echo "+ $*"
  HIDDEN_NVRTC="$others" KJIT_CACHE_DIR="$work/cache-$name" LD_DEBUG=files \
    LD_DEBUG_OUTPUT="$trace" "${hide[@]}" "$@" >"$work/out-$name" 2>&1 || rc=$?
  local opened
  opened=$(cat "$trace".* | sed -n 's/.*file=\([^ ]*libnvrtc[^ ]*\) .*generating link map.*/\1/p' | sort -u)
  echo "  libnvrtc files opened: $(echo $opened)"
  grep -q "libnvrtc-builtins.so" <<<"$opened" || fail "$name: libnvrtc-builtins was never opened"
  for f in $opened; do
    [[ "$f" == "$nvrtc_dir/"* ]] || fail "$name: opened $f, not pip's copy in $nvrtc_dir"
  done
  return $rc
}

compile_both() {
  local name=$1
  shift
  for arch in sm_90 sm_100; do
    run_checked "$name-compile-$arch" "$@" compile --op cross_entropy --vocab 128256 --arch "$arch" ||
      fail "$name compile --arch $arch failed with pip's NVRTC: $(cat "$work/out-$name-compile-$arch")"
    grep -q "from    compiled" "$work/out-$name-compile-$arch" ||
      fail "$name compile --arch $arch did not compile: $(cat "$work/out-$name-compile-$arch")"
  done
}

# doctor exits 1 without a GPU (the driver's FAIL): its NVRTC and compile findings must be OK.
doctor_ok() {
  local name=$1
  shift
  run_checked "$name-doctor" "$@" doctor --json --arch sm_90,sm_100 || true
  "$python" - "$work/out-$name-doctor" <<'EOF' || fail "$name doctor: $(cat "$work/out-$name-doctor")"
import json, sys
text = open(sys.argv[1]).read()
findings = {f["check"]: f for f in json.loads(text[text.index("{"):])["findings"]}
for check in ("nvrtc", "compile.sm_90", "compile.sm_100"):
    got = findings.get(check, {}).get("status")
    if got != "OK":
        sys.exit(f"doctor's {check} is {got}, expected OK: {findings.get(check)}")
EOF
}

if [ "$mode" = kjit ]; then
  export KJIT_NVRTC_PATH="$nvrtc_dir/libnvrtc.so.13"
  compile_both kjit "$program"
  doctor_ok kjit "$program"
else
  unset KJIT_NVRTC_PATH
  compile_both python-m "$python" -m kjit
  compile_both console-script "$(dirname "$python")/kjit"
  doctor_ok python-m "$python" -m kjit
fi
echo "pip's NVRTC alone compiles for sm_90 and sm_100"
