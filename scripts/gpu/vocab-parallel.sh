#!/usr/bin/env bash
# Issue 37's multi-GPU rows: kjit's vocab-parallel cross-entropy over NCCL at TP = 2, 4 and 8 (one
# GPU a rank), throughput per GPU against TP=1 and the cost of the two all-reduces alone
# (scripts/gpu/vocab_parallel_bench.py under torchrun, one JSON line per TP size). Exits 77 (skipped)
# when the machine has fewer GPUs than the largest TP size asked, before running anything. Needs
# torch and the kjit package importable by python3 (or $PYTHON).
#   scripts/gpu/vocab-parallel.sh [TP sizes...]     default: 2 4 8
#   VOCAB=128256 ROWS=16384 scripts/gpu/vocab-parallel.sh 2
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
. scripts/gpu/common.sh
tp_sizes vocab-parallel.sh "$@"
torchrun_each scripts/gpu/vocab_parallel_bench.py --vocab "${VOCAB:-128256}" --rows "${ROWS:-16384}"
