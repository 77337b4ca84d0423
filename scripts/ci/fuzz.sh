#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang-14 in build-fuzz and runs each for a bounded
# time on a copy of its seed corpus (tests/fuzz/corpus/<name>), so the repository is not modified,
# with its dictionary (tests/fuzz/<name>.dict) when it has one.
# Exits non-zero when a fuzzer crashes, leaks, trips a sanitizer or breaks an invariant; the
# reproducer is left in build-fuzz/fuzz-artifacts/<name>/ (turn it into a regression test in
# tests/jit/ and fix the parser).
#
#   scripts/ci/fuzz.sh                 # 60 s per fuzzer
#   FUZZ_SECONDS=10 scripts/ci/fuzz.sh
#   FUZZERS="target dtype" scripts/ci/fuzz.sh
set -euo pipefail

cd "$(dirname "$0")/../.."
root=$(pwd)
build=${BUILD_DIR:-$root/build-fuzz}
seconds=${FUZZ_SECONDS:-60}
jobs=${JOBS:-$(nproc)}
fuzzers=${FUZZERS:-"cache_entry cache_max_bytes dtype hf_config target tuning_db op_spec kjit_cli kjit_tune_cli sharded_capi"}

if ! command -v clang++-14 >/dev/null || ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
    >/dev/null 2>&1; then
  echo "ci-fuzz: installing clang-14 and libclang-rt-14-dev"
  sudo_cmd=""
  if [ "$(id -u)" != 0 ]; then sudo_cmd=sudo; fi
  $sudo_cmd apt-get update -qq
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-14 libclang-rt-14-dev
fi

CC=clang-14 CXX=clang++-14 cmake -S "$root" -B "$build" -DKJIT_BUILD_FUZZERS=ON >/dev/null
cmake --build "$build" --target kjit_fuzzers -j "$jobs"

work=$(mktemp -d "${TMPDIR:-/tmp}/kjit-fuzz-XXXXXX")
trap 'rm -rf "$work"' EXIT
failed=()
for name in $fuzzers; do
  bin=$build/tests/fuzz/${name}_fuzzer
  corpus=$work/$name
  artifacts=$build/fuzz-artifacts/$name
  mkdir -p "$corpus" "$artifacts"
  cp -R "$root/tests/fuzz/corpus/$name/." "$corpus/"
  echo "ci-fuzz: $name for ${seconds}s ($(ls "$corpus" | wc -l) seeds)"
  log=$work/$name.log
  dict=()
  if [ -f "$root/tests/fuzz/$name.dict" ]; then dict=(-dict="$root/tests/fuzz/$name.dict"); fi
  start=$(date +%s)
  if "$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      ${dict[@]+"${dict[@]}"} -artifact_prefix="$artifacts/" "$corpus" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    failed+=("$name")
  fi
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "ci-fuzz: $name $status: $runs runs in $(( $(date +%s) - start ))s, $cov, corpus $(ls "$corpus" | wc -l)"
  if [ "$status" = FAILED ]; then
    tail -n 60 "$log"
    echo "ci-fuzz: reproducer(s) in $artifacts:"; ls -l "$artifacts"
  fi
done

if [ ${#failed[@]} -ne 0 ]; then
  echo "ci-fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "ci-fuzz: all fuzzers ran clean"
