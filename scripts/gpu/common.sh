# shellcheck shell=bash
# Sourced by the scripts in scripts/gpu/, which run on the lent GPU machine from the repository
# root (the device tool's working directory): the set-up they share, as functions, so that each
# script says which pieces it takes.
#
#   gpu_output [DEFAULT]   out: $OUT, else DEFAULT (default /tmp/kjit-out); created
#   gpu_bundle [--toolkit] bin: the programs of .device-bundle (scripts/package/device-bundle);
#                          LD_LIBRARY_PATH starts with the bundle's libraries, then with --toolkit
#                          the CUDA toolkit's (cuBLASLt is never bundled: the GPU machine has its
#                          own CUDA 13)
#   gpu_info FILE FIELDS [FORMAT]
#                          nvidia-smi's --query-gpu=FIELDS (--format=FORMAT, default csv), shown
#                          and written to FILE
#   compute_sanitizer      prints compute-sanitizer's path: the one on PATH, else the toolkit's
#   no_nvlink_multicast    turns NVLink multicast off for NCCL, torch and NVSHMEM (a program using
#                          it can take the host's shared GPUs down)
#   fresh_kernel_cache     KJIT_CACHE_DIR: a new, empty folder
#   kernel_cache_start     KJIT_CACHE_DIR: a new folder, seeded from .device-cache/kernels.tgz
#   kernel_cache_save      its most recently used entries as $out/kernels.tgz, as many as fit the
#                          15 MiB a call returns
#   wheel_env LOG          python: a virtual environment with the carried kjit wheel (below)
#   tp_sizes NAME [sizes...], torchrun_each SCRIPT ARGS...
#                          the multi-GPU TP benchmarks' sizes and runs (below)

gpu_output() {
  out=${OUT:-${1:-/tmp/kjit-out}}
  mkdir -p "$out"
}

gpu_bundle() {
  bin=$PWD/.device-bundle/bin
  local libs=$PWD/.device-bundle/lib
  [ "${1:-}" = --toolkit ] && libs+=:/usr/local/cuda/lib64
  export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
}

gpu_info() {
  nvidia-smi --query-gpu="$2" --format="${3:-csv}" 2>&1 | tee "$1"
}

compute_sanitizer() {
  command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer
}

no_nvlink_multicast() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

# The kernel cache. The lent GPU machine starts bare on every lease, and most of a GPU suite's time
# there goes to NVRTC compiles that were already made in an earlier call (the full suite took
# about 650 s on a cold cache), and device time is rationed, so a script may keep its cache:
#
#   kernel_cache_start   # KJIT_CACHE_DIR: a new folder, seeded from .device-cache/kernels.tgz
#   ...                  # the tests and benchmarks
#   kernel_cache_save    # its most recently used entries as $out/kernels.tgz
#
# On this side, copy the returned kernels.tgz into .device-cache/ (ignored by git) and name
# .device-cache in the next call's carry. Only entries travel, never a tuning database, so the
# tests still run the heuristics; an entry is checksummed and keyed by its program, NVRTC version
# and target, so a stale or foreign one is a miss, never a wrong kernel. KJIT_COLD_CACHE=1 starts
# empty (for first-call and tuning-time measurements, which must compile).
fresh_kernel_cache() {
  KJIT_CACHE_DIR=$(mktemp -d)/kjit
  export KJIT_CACHE_DIR
  mkdir -p "$KJIT_CACHE_DIR"
}

kernel_cache_start() {
  fresh_kernel_cache
  # No cap while the run compiles: a cap below the seed evicts the carried entries before they are
  # used (run 2 of verify.sh seeded 94 MB under a 40 MiB cap and compiled 2,000 programs again).
  # kernel_cache_save picks what fits the way back instead.
  export KJIT_CACHE_MAX_BYTES=0
  local seed=.device-cache/kernels.tgz
  if [ "${KJIT_COLD_CACHE:-0}" != 1 ] && [ -f "$seed" ]; then
    if tar -xzf "$seed" -C "$KJIT_CACHE_DIR" --wildcards '*.kjit' 2>/dev/null; then
      echo "kernel cache: $(find "$KJIT_CACHE_DIR" -name '*.kjit' | wc -l) entries from $seed"
    else
      echo "kernel cache: $seed unreadable, starting empty"
      rm -rf "$KJIT_CACHE_DIR" && mkdir -p "$KJIT_CACHE_DIR"
    fi
  else
    echo "kernel cache: empty"
  fi
}

# The most recently used entries (a hit touches an entry's mtime) whose archive fits what a call
# returns (15 MiB): at most $1 bytes of entries (default 56 MiB, about 13 MiB compressed), a quarter
# fewer each time the archive is still too large.
kernel_cache_save() {
  local archive=$out/kernels.tgz budget=${1:-58720256} bytes list
  list=$(mktemp)
  while [ "$budget" -gt 1048576 ]; do
    (cd "$KJIT_CACHE_DIR" && find . -maxdepth 1 -name '*.kjit' -printf '%T@ %s %p\n' | sort -rn |
      awk -v budget="$budget" '{ total += $2; if (total <= budget) printf "%s%c", $3, 0 }' \
      > "$list" && tar -czf "$archive" --null -T "$list") || {
      # (awk reads to the end: one that stopped early failed the pipe under pipefail, and run 3
      # of verify.sh saved nothing without a word)
      echo "kernel cache: not saved (archiving failed)"
      rm -f "$archive" "$list"
      return 0
    }
    bytes=$(stat -c %s "$archive")
    if [ "$bytes" -le 15728640 ]; then
      echo "kernel cache: $(tr -cd '\0' < "$list" | wc -c) of $(find "$KJIT_CACHE_DIR" -maxdepth 1 \
        -name '*.kjit' | wc -l) entries, the most recently used, saved to kernels.tgz ($bytes bytes)"
      rm -f "$list"
      return 0
    fi
    budget=$((budget * 3 / 4))
  done
  echo "kernel cache: not saved (no archive fits 15 MiB)"
  rm -f "$archive" "$list"
}

# wheel_env LOG: python: the interpreter of a new virtual environment over the machine's packages
# (torch, transformers, pytest; the machine reaches no registry), without pip of its own: the
# system's pip, run by the venv's interpreter, installs .device-wheel's kjit wheel (its console
# scripts beside that interpreter, as for a user) and the wheels in .whl/ into it. On the GPU
# image python3 is itself a venv (/opt/torch/.venv): a .pth file names its site-packages, which
# --system-site-packages alone would not reach. pip's output goes to LOG, shown when it fails
# (status 1).
wheel_env() {
  local env_dir
  env_dir=$(mktemp -d)/env
  # shellcheck disable=SC2046  # the wheels in .whl/, when there are any
  python3 -m venv --without-pip --system-site-packages "$env_dir" &&
    python3 -c 'import site; print("\n".join(site.getsitepackages()))' > \
      "$("$env_dir/bin/python" -c 'import site; print(site.getsitepackages()[0])')/machine.pth" &&
    "$env_dir/bin/python" -m pip install -q --no-deps --no-index --no-compile \
      .device-wheel/kjit-*.whl $(ls .whl/*.whl 2>/dev/null) > "$1" 2>&1 ||
    { cat "$1"; return 1; }
  python=$env_dir/bin/python
}

# The multi-GPU TP benchmarks (vocab-parallel.sh, tp-linear-cross-entropy.sh):
#   tp_sizes NAME [sizes...]   sets the array `sizes` (default 2 4 8); exits 2 on one that is not
#                              a number, 77 (skipped) when the machine has fewer GPUs than the
#                              largest, before anything runs; turns NVLink multicast off
#   torchrun_each SCRIPT ARGS  runs SCRIPT under torchrun at each size (one GPU a rank) with
#                              $python (default python3); returns 1 if any run failed
tp_sizes() {
  local name=$1 n most=0 gpus
  shift
  sizes=("$@")
  [ ${#sizes[@]} -eq 0 ] && sizes=(2 4 8)
  for n in "${sizes[@]}"; do
    case $n in '' | *[!0-9]*) echo "$name: $n is not a number of GPUs" >&2; exit 2 ;; esac
    [ "$n" -gt "$most" ] && most=$n
  done
  gpus=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l)
  if [ "$gpus" -lt "$most" ]; then
    echo "SKIPPED: TP=$most needs $most GPUs; this machine has $gpus"
    exit 77
  fi
  no_nvlink_multicast
}

torchrun_each() {
  local n status=0
  for n in "${sizes[@]}"; do
    "${python:-python3}" -m torch.distributed.run --standalone --nproc-per-node "$n" "$@" ||
      status=1
  done
  return $status
}
