#!/usr/bin/env bash
# Runs on the lent GPU machine (README.md, "Tests and benchmarks"): the autotuner end to end. Build here
# and bundle kjit-tune and kjit:
#   scripts/package/device-bundle build/tools/kjit-tune build/tools/kjit
# then, through the device tool, with carry [".device-bundle"]:
#   bash scripts/gpu/tune.sh
# Writes under $OUT: the first and second `kjit-tune --model llama-3.1-8b` reports with their wall
# times, a run with a planted GPU fault and crash, and `kjit bench` of both ops with the database.
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle
fresh_kernel_cache
status=0
timed() {  # timed NAME CMD...: runs CMD, stdout to $out/NAME.json, stderr to $out/NAME.log
  local name=$1; shift
  local t0=$(date +%s%N)
  "$@" > "$out/$name.json" 2> "$out/$name.log"
  local rc=$?
  local t1=$(date +%s%N)
  echo "$name: exit $rc, $(( (t1 - t0) / 1000000 )) ms" | tee -a "$out/times.txt"
  tail -12 "$out/$name.log"
  [ $rc = 0 ] || status=1
}
echo "== kjit-tune, empty cache and database"
timed tune-first timeout 300 "$bin/kjit-tune" --model llama-3.1-8b --json
echo "== kjit-tune again: database and cache present"
timed tune-second timeout 120 "$bin/kjit-tune" --model llama-3.1-8b --json
echo "== kjit-tune with a planted GPU fault and a crash (own database)"
KJIT_TUNE_INJECT_FAULT="gpu-fault:vec=8 threads=256 unroll=2 cluster=0 staged=0;crash:vec=8 threads=512 unroll=1 cluster=0 staged=0" \
  timed tune-faults timeout 300 "$bin/kjit-tune" --vocab 32000 --hidden 1024 --tokens 2048 \
  --db "$out/faults-db.json" --json
echo "== bench with the tuned database"
timed bench-cross_entropy timeout 200 "$bin/kjit" bench --op cross_entropy --json
timed bench-rms_norm timeout 120 "$bin/kjit" bench --op rms_norm --json
cp "$KJIT_CACHE_DIR/tuning.json" "$out/tuning.json" 2>/dev/null
# The device tool brings back at most 8 files: one archive of everything.
tar czf "$out/../tune-results.tgz" -C "$out" . && rm -rf "$out"/* && mv "$out/../tune-results.tgz" "$out/"
exit $status
