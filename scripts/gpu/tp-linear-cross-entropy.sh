#!/usr/bin/env bash
# Issue 50's multi-GPU rows: kjit's vocab-parallel fused lm_head + cross-entropy over NCCL at TP =
# 2, 4 and 8 (one GPU a rank), throughput per GPU and peak memory against the single-GPU fused op
# (TP=1), against gathering the logits and against the unfused vocab-parallel loss
# (scripts/gpu/tp_linear_cross_entropy_bench.py under torchrun, one JSON line per TP size). Exits 77
# (skipped) when the machine has fewer GPUs than the largest TP size asked, before running
# anything. Needs torch and the kjit package importable by python3 (or $PYTHON).
#   scripts/gpu/tp-linear-cross-entropy.sh [TP sizes...]     default: 2 4 8
#   VOCAB=128256 HIDDEN=4096 ROWS=8192 DTYPE=bf16 scripts/gpu/tp-linear-cross-entropy.sh 2
set -uo pipefail
cd "$(dirname "$0")/../.."
python=${PYTHON:-python3}
. scripts/gpu/common.sh
tp_sizes tp-linear-cross-entropy.sh "$@"
torchrun_each scripts/gpu/tp_linear_cross_entropy_bench.py --vocab "${VOCAB:-128256}" \
  --hidden "${HIDDEN:-4096}" --rows "${ROWS:-8192}" --dtype "${DTYPE:-bf16}"
