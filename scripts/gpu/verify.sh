#!/usr/bin/env bash
# One run on a lent GPU machine that proves a commit: every GPU check kjit has, in under 9.5
# minutes, everything written under $OUT (issue 44). Prepare it here, on the CPU, first:
#
#   scripts/gpu/prepare.sh          # the bundle, the wheel, the Python wheels the GPU lacks
#
# then, through the device tool, with carry [".device-bundle", ".device-wheel", ".whl",
# ".device-cache"]:
#
#   bash scripts/gpu/verify.sh
#
# Stages (the first three side by side: the GPU has room for them and their time is NVRTC's and
# the host's; the last two alone, since they measure memory or time):
#   cpp        the whole C++ GPU suite, as gtest shards, then alone the tests that read device-wide
#              memory or time kjit-tune;
#   sanitizer  compute-sanitizer memcheck and racecheck on a subset with every kernel family:
#              cross-entropy (every option family), RMSNorm (forward, backward, residual), the fused
#              lm_head + loss, the sharded cross-entropy, the RL heads, and kjit's GEMM (the
#              harness's small shapes);
#   python     the wheel of the same commit in a virtual environment over the machine's torch, and
#              tests/python with its GPU tests (ops and extras against torch, apply_to on Hugging
#              Face families, the Trainer and TRL's trainer, torch.compile, CUDA graphs,
#              kjit.torch.distributed over gloo and NCCL);
#   bench      `kjit bench` of cross-entropy, RMSNorm, the lm_head op and the RL heads at their
#              standard rows, and `python -m kjit.bench`'s lm_head row and RL rows (issue 47)
#              beside eager and torch.compile.
# Then scripts/gpu/summarize.py writes $OUT/summary.json (commit, device, driver, wall_s,
# nvrtc_s, each stage's passed / failed / skipped / wall_s) and prints it; the logs and the
# benchmarks' JSON go back in $OUT/logs.tgz, the kernel cache in $OUT/kernels.tgz. The run's cache
# starts from .device-cache/kernels.tgz: prepare.sh's compile-only pass, or a kernels.tgz an earlier
# run returned (copy it there), so that the run spends its time running kernels, not compiling.
#
# Environment: STAGES (default "cpp sanitizer python bench") picks stages; SHARDS (default 12) the
# C++ suite's processes; CPP_FILTER (default *) the suite's tests besides the serial ones, for a
# call that reruns a few; PYTEST_ARGS adds pytest arguments; KJIT_COLD_CACHE=1 starts without the
# carried cache. Exit status 0 only when every stage ran with nothing failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
source scripts/gpu/common.sh
gpu_output /tmp/kjit-verify
logs=$out/logs
mkdir -p "$logs"
stages=" ${STAGES:-cpp sanitizer python bench} "
now_ms() { echo $(($(date +%s%N) / 1000000)); }
run_start=$(now_ms)
# The bundle's libraries (Abseil, fmt, ...); the toolkit's for the GEMM harness's cuBLASLt.
gpu_bundle --toolkit
export PYTHONUNBUFFERED=1
# A crash in Python (a test's subprocess, a spawned rank) prints every thread's stack to stderr,
# which the tests show: run 2 had three SIGSEGVs and not a line of where.
export PYTHONFAULTHANDLER=1
no_nvlink_multicast
export KJIT_TUNE_BIN=$bin/kjit-tune  # TuningGpu's KJIT_AUTOTUNE test runs it
kernel_cache_start > "$logs/cache.txt"  # not through a pipe: it sets KJIT_CACHE_DIR
cat "$logs/cache.txt"
traces=$(mktemp -d)  # one KJIT_TRACE file a stage: its compile events give the time in NVRTC
gpu_info "$logs/gpu.txt" name,driver_version,memory.total,clocks.sm,temperature.gpu csv,noheader

# stage_end NAME START RC: the stage's wall time and exit status, for summarize.py.
stage_end() {
  printf '{"stage": "%s", "wall_s": %s, "rc": %d}\n' "$1" \
    "$(awk -v a="$2" -v b="$(now_ms)" 'BEGIN {printf "%.1f", (b - a) / 1000}')" "$3" \
    > "$logs/stage-$1.json"
  echo "== $1 done (exit $3)"
}
wants() { [[ $stages == *" $1 "* ]]; }
# Seconds every stage before the benchmarks leaves them (BENCH_S, default 150): run 2 spent its
# whole deadline in the suites and the benchmarks got none.
bench_keep=0
wants bench && bench_keep=${BENCH_S:-150}
# The whole run ends by DEADLINE_S (default 560) seconds after its start, whatever the stages'
# own limits, keeping 15 s for the summary and the archives: `limit N [R]` is N or what is left
# with R more seconds kept for what must follow.
limit() {
  local left=$((${DEADLINE_S:-560} - 15 - ${2:-0} - ($(now_ms) - run_start) / 1000))
  [ "$left" -gt 1 ] || left=1
  echo $(($1 < left ? $1 : left))
}
# checked NAME SECONDS COMMAND...: runs it with a time limit (keeping $reserve seconds for later),
# its output in NAME.log and its exit status in NAME.rc (summarize.py counts one per .rc file).
checked() {
  local name=$1 limit=$2 rc=0
  shift 2
  timeout "$(limit "$limit" "${reserve:-0}")" "$@" > "$logs/$name.log" 2>&1 || rc=$?
  echo $rc > "$logs/$name.rc"
  [ $rc = 0 ] || echo "$name failed (exit $rc): $(tail -2 "$logs/$name.log")"
  return $rc
}

# The C++ tests that must run alone: they read device-wide free memory or time kjit-tune.
serial='CrossEntropyGpu.AllocatesNothingAndTheWorkspaceIsORows:LinearCrossEntropyGpu.TakesNoMemoryBeyondItsWorkspace:TuningGpu.*:GpuTimerGpu.*'

cpp_shards() {
  local t0 rc=0 pids=() shards=${SHARDS:-12} reserve=$((30 + bench_keep))
  t0=$(now_ms)
  for ((i = 0; i < shards; i++)); do
    GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i KJIT_TRACE=$traces/cpp-$i.json \
      checked "cpp-shard$i" 300 nice -n 5 "$bin/kjit_gpu_tests" --gtest_filter="${CPP_FILTER:-*}-$serial" \
      --gtest_output="json:$logs/cpp-shard$i.json" &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  echo "$t0 $rc" > "$logs/.cpp-shards"
}

# Each kernel family's thorough tests, one sanitizer process a test (they run side by side), and the
# GEMM harness's small shapes. racecheck takes the smaller of them: it is the slower tool.
memchecked='CrossEntropyGpu.EveryOptionCombination CrossEntropyGpu.ClassWeights CrossEntropyGpu.EntropyAndTargetLogprob CrossEntropyGpu.StridedAndMisalignedViewsSplitIntoHeadVectorsAndTail CrossEntropyGpu.RescaleGradientPerRowLeavesEqualRowsAndNanOnlyItsRow RmsNormGpu.EveryOptionCombination RmsNormGpu.MisalignedViewsUseNarrowerVectors LinearCrossEntropyGpu.OddShapesOneRowAndAllIgnored LinearCrossEntropyGpu.ForwardOnly ShardedCrossEntropyGpu.EveryOptionAndReduction CapiCrossEntropyGpu.* LogProbsGpu.*'
racechecked='CrossEntropyGpu.StridedAndMisalignedViewsSplitIntoHeadVectorsAndTail CrossEntropyGpu.EntropyAndTargetLogprob CrossEntropyGpu.NanRowLeavesOtherRowsFinite RmsNormGpu.MisalignedViewsUseNarrowerVectors RmsNormGpu.NanRowLeavesOtherRowsFinite LinearCrossEntropyGpu.OddShapesOneRowAndAllIgnored ShardedCrossEntropyGpu.SplitsMatchUnshardedAndReference CapiCrossEntropyGpu.ClassWeights LogProbsGpu.ShapesDtypesAndViews'
sanitizer() {
  local t0 rc=0 san pids=() test reserve=$((30 + bench_keep))
  t0=$(now_ms)
  san=$(compute_sanitizer)
  for tool in memcheck racecheck; do
    checked "sanitizer-$tool-gemm" 280 nice -n 10 "$san" --tool $tool --error-exitcode 3 "$bin/gemm_harness" \
      quick &
    pids+=($!)
    tests=$memchecked
    [ $tool = racecheck ] && tests=$racechecked
    for test in $tests; do
      checked "sanitizer-$tool-${test//[.*]/_}" 400 nice -n 10 "$san" --tool $tool --error-exitcode 3 \
        "$bin/kjit_gpu_tests" --gtest_filter="$test" &
      pids+=($!)
    done
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
  stage_end sanitizer "$t0" $rc
}

python_suite() {
  local t0 rc=0 python
  t0=$(now_ms)
  wheel_env "$logs/python-install.log" || { stage_end python "$t0" 1; return; }
  echo "$python" > "$logs/.python"
  # shellcheck disable=SC2086  # PYTEST_ARGS is a list of arguments
  # Four pytest workers where pytest-xdist is installed (the GPU image has it).
  local workers=()
  "$python" -c 'import xdist' 2> /dev/null && workers=(-n 4)
  KJIT_TRACE=$traces/python.json timeout "$(limit 400 $((30 + bench_keep)))" "$python" -m pytest -rs -v -p no:cacheprovider \
    "${workers[@]}" --junitxml="$logs/python-junit.xml" tests/python ${PYTEST_ARGS:-} \
    > "$logs/python.log" 2>&1 || rc=1
  grep -E '^(FAILED|ERROR) ' "$logs/python.log"; tail -3 "$logs/python.log"
  stage_end python "$t0" $rc
}

bench() {
  local t0 rc=0
  t0=$(now_ms)
  export KJIT_TRACE=$traces/bench.json
  for op in cross_entropy rms_norm linear_cross_entropy log_probs; do
    checked "bench-$op" 150 "$bin/kjit" bench --op $op --output "$logs/bench-$op.json" || rc=1
  done
  if [ -f "$logs/.python" ]; then
    checked bench-python-lce 150 "$(cat "$logs/.python")" -m kjit.bench \
      --case lce:8192x4096x128256 --json "$logs/bench-python-lce.json" || rc=1
    # Issue 47's RL heads: from logits against the copy, from hidden states against the GEMMs.
    checked bench-python-rl 150 "$(cat "$logs/.python")" -m kjit.bench \
      --case rl-logits:16384x151936 --case rl:8192x4096x151936 \
      --json "$logs/bench-python-rl.json" || rc=1
  fi
  cat "$logs"/bench-*.log
  unset KJIT_TRACE
  stage_end bench "$t0" $rc
}

# The summary and the archives, also when the call's own limit ends the run early (SIGTERM).
finish() {
  trap - TERM INT
  python3 scripts/gpu/summarize.py --logs "$logs" --traces "$traces" --stages "$stages" \
    --wall-ms $(($(now_ms) - run_start)) --out "$out/summary.json"
  local rc=$?
  cp "$traces"/*.json "$logs/" 2> /dev/null
  tar -czf "$out/logs.tgz" -C "$out" logs && rm -rf "$logs"
  exit $rc
}
trap 'echo "verify: ended early by a signal"; kernel_cache_save >> "$logs/cache.txt"; finish' TERM INT

wants cpp && cpp_shards &
wants sanitizer && sanitizer &
wants python && python_suite &
wait
if wants cpp; then
  read -r t0 rc < "$logs/.cpp-shards"
  # A shard that ended without its report (a crash) runs again alone, to tell a crash that repeats
  # from one that needed the company: the summary lists both, and counts the first.
  for log in "$logs"/cpp-shard*.log; do
    i=${log##*cpp-shard}; i=${i%.log}
    [ -f "$logs/cpp-shard$i.json" ] && continue
    reserve=$bench_keep GTEST_TOTAL_SHARDS=${SHARDS:-12} GTEST_SHARD_INDEX=$i checked "rerun-cpp-shard$i" 200 \
      "$bin/kjit_gpu_tests" --gtest_filter="${CPP_FILTER:-*}-$serial" --gtest_output="json:$logs/rerun-cpp-shard$i.json"
  done
  KJIT_TRACE=$traces/cpp-serial.json timeout "$(limit 200 "$bench_keep")" "$bin/kjit_gpu_tests" --gtest_filter="$serial" \
    --gtest_output="json:$logs/cpp-serial.json" > "$logs/cpp-serial.log" 2>&1 || rc=1
  grep -h -E '^\[  FAILED  \]' "$logs"/cpp-*.log | sort -u
  stage_end cpp "$t0" "$rc"
fi
kernel_cache_save >> "$logs/cache.txt"  # before the benchmarks: the call's limit may end them
tail -1 "$logs/cache.txt"
wants bench && bench
finish
