# shellcheck shell=bash
# Sourced by the gpu-*.sh scripts: a kernel cache that outlives the lent GPU machine, which starts
# bare on every lease. Most of a GPU suite's time there goes to NVRTC compiles that were already
# made in an earlier call (the full suite took about 650 s on a cold cache), and device time is
# rationed, so:
#
#   kernel_cache_start   # KJIT_CACHE_DIR: a new folder, seeded from .device-cache/kernels.tgz
#   ...                  # the tests and benchmarks
#   kernel_cache_save    # its entries as $OUT/kernels.tgz (when at most 15 MiB: what comes back)
#
# On this side, copy the returned kernels.tgz into .device-cache/ (ignored by git) and
# name .device-cache in the next call's carry. Only entries travel, never a tuning database, so the
# tests still run the heuristics; an entry is checksummed and keyed by its program, NVRTC version
# and target, so a stale or foreign one is a miss, never a wrong kernel. KJIT_COLD_CACHE=1 starts
# empty (for first-call and tuning-time measurements, which must compile).
kernel_cache_start() {
  KJIT_CACHE_DIR=$(mktemp -d)/kjit
  export KJIT_CACHE_DIR
  mkdir -p "$KJIT_CACHE_DIR"
  # A cap keeps the archive within what a call returns; least recently used entries go first.
  export KJIT_CACHE_MAX_BYTES=${KJIT_CACHE_MAX_BYTES:-41943040}
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

kernel_cache_save() {
  local archive="${OUT:-/tmp/kjit-out}/kernels.tgz"
  (cd "$KJIT_CACHE_DIR" && find . -maxdepth 1 -name '*.kjit' -print0 |
    tar -czf "$archive" --null -T -) || { rm -f "$archive"; return 0; }
  local bytes
  bytes=$(stat -c %s "$archive")
  if [ "$bytes" -gt 15728640 ]; then
    echo "kernel cache: $bytes bytes compressed, over what a call returns; not saved"
    rm -f "$archive"
  else
    echo "kernel cache: $(find "$KJIT_CACHE_DIR" -maxdepth 1 -name '*.kjit' | wc -l) entries saved to kernels.tgz ($bytes bytes)"
  fi
}
