#!/usr/bin/env bash
# Runs on the lent GPU machine: `kjit bench` of two builds alternating (before/after a change), so
# that both are measured on the same card, in one call, under the same clocks. Bundle each build
# here first (scripts/package/device-bundle --out .device-ab/base BASE/build/tools/kjit, and likewise
# head), then, through the device tool, with carry [".device-ab", ".device-cache"]:
#   ROUNDS=4 bash scripts/gpu/bench-ab.sh .device-ab/base .device-ab/head -- --op rms_norm
#   ... -- --op rms_norm --rows 256 --hidden 4096 --repeats 2000 -- --op cross_entropy
# Each `--`-separated argument list is one benchmark; every round runs each of them on base, then on
# head (odd rounds) or head then base (even rounds). The reports come back as $OUT/ab.tgz
# (BENCH-INDEX-{base,head}-ROUND.json); bench/compare_runs.py summarizes them.
set -uo pipefail
[ $# -ge 3 ] && [ "$3" = "--" ] || { sed -n 2,10p "$0"; exit 2; }
source "$(dirname "$0")/common.sh"
gpu_output
mkdir -p "$out/ab"
builds=(base head)
declare -A dir=([base]=$1 [head]=$2)
shift 3
benches=() current=""
for a in "$@"; do
  if [ "$a" = "--" ]; then benches+=("$current"); current=""; else current+="${current:+ }$a"; fi
done
benches+=("$current")
kernel_cache_start
gpu_info "$out/ab/gpu.txt" name,driver_version,clocks.sm,clocks.mem,temperature.gpu
status=0
for ((round = 1; round <= ${ROUNDS:-2}; round++)); do
  order=(base head)
  [ $((round % 2)) = 0 ] && order=(head base)
  for ((i = 0; i < ${#benches[@]}; i++)); do
    for b in "${order[@]}"; do
      file="$out/ab/bench$i-$b-$round.json"
      # shellcheck disable=SC2086  # each benchmark's flags split on spaces
      LD_LIBRARY_PATH=${dir[$b]}/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} timeout 300 \
        "${dir[$b]}/bin/kjit" bench ${benches[$i]} --output "$file" > /dev/null || {
        echo "bench$i ($b, round $round) failed: kjit bench ${benches[$i]}"; status=1; }
    done
  done
  echo "round $round done"
done
tar -czf "$out/ab.tgz" -C "$out" ab && rm -rf "$out/ab"
kernel_cache_save
exit $status
