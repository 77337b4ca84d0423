#!/usr/bin/env bash
# Installs kjit's build dependencies from Debian's packages when they are missing, and checks for
# the CUDA toolkit (headers and NVRTC; kjit needs no GPU to build or to run its CPU tests).
#
#   scripts/setup.sh            # for the C++ build and its tests: the toolkit is required
#   scripts/setup.sh --python   # for `pip install .` only: without a toolkit the wheel's build
#                               # takes cuda.h and nvrtc.h from pip's nvidia packages (pyproject.toml)
set -euo pipefail
python_only=0
case ${1:-} in
  --python) python_only=1 ;;
  "") ;;
  *) echo "setup: unknown argument '$1' (--python or nothing)" >&2; exit 2 ;;
esac
packages=(cmake make g++ pkg-config libfmt-dev libabsl-dev libgtest-dev libboost-dev libboost-filesystem-dev
          nlohmann-json3-dev libcli11-dev libxxhash-dev ccache)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  echo "setup: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
cuda=${CUDA_HOME:-/usr/local/cuda}
if [ ! -f "$cuda/include/cuda.h" ] || [ ! -f "$cuda/include/nvrtc.h" ]; then
  if [ $python_only = 1 ]; then
    echo "setup: dependencies present; no CUDA toolkit under $cuda: \`pip install .\` takes cuda.h and nvrtc.h from pip's nvidia-cuda-runtime and nvidia-cuda-nvrtc"
    exit 0
  fi
  echo "setup: the CUDA toolkit (cuda.h, nvrtc.h) was not found under $cuda; install CUDA 12.8+ or set CUDA_HOME" >&2
  exit 1
fi
echo "setup: dependencies present (CUDA toolkit at $cuda)"
