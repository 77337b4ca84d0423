#!/usr/bin/env bash
# Runs on the lent GPU machine (README.md, "Tests and benchmarks"): bench/finetune_step, the baseline
# against kjit, everything written under $OUT:
#   1. a smoke run at a small shape (llama-3.2-1b, batch 1 x seq 256);
#   2. the default shape (llama-3.1-8b, batch 4 x seq 2048, bf16) with --json and --trace: the
#      figures (finetune.json, finetune.txt) and the Chrome trace (finetune-trace.json);
#   3. a shape the baseline cannot fit (batch 16 x seq 8192: its fp32 [tokens, vocab] tensors need
#      at least 163 GiB, measured): it must say so and exit 3 while the kjit paths still run.
# Build here first and bundle (cuBLASLt is not bundled: the GPU machine has its own CUDA 13):
#   cmake --build build --target finetune_step
#   scripts/package/device-bundle build/bench/finetune_step/finetune_step
# then, through the device tool, with carry [".device-bundle"]:
#   bash scripts/gpu/finetune.sh
# The three runs fit the device tool's 10 minutes per command (about 2 minutes in all, mostly
# NVRTC compiles into a fresh cache).
set -uo pipefail
source "$(dirname "$0")/common.sh"
gpu_output
gpu_bundle --toolkit
fresh_kernel_cache
step=$bin/finetune_step
# libcublasLt.so.13 elsewhere than the toolkit's usual place (a pip wheel's nvidia/cu13/lib, say).
if ! ldd "$step" | grep -q "libcublasLt.so.13 => /"; then
  lt=$(find /usr/local /usr/lib /opt $(python3 -c 'import site; print(*site.getsitepackages())' 2>/dev/null) \
         -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
  [ -n "$lt" ] && export LD_LIBRARY_PATH=$(dirname "$lt"):$LD_LIBRARY_PATH
fi
ldd "$step" | grep -E "cublasLt|not found" | tee "$out/ldd.txt"
gpu_info "$out/gpu.txt" name,driver_version,memory.total,clocks.sm,clocks.mem,temperature.gpu
status=0

echo "== smoke: llama-3.2-1b, batch 1 x seq 256"
timeout 120 "$step" --model llama-3.2-1b --batch 1 --seq 256 --steps 5 2>&1 | tee "$out/finetune-smoke.txt" || status=1

echo "== default shape: llama-3.1-8b, batch 4 x seq 2048"
timeout 240 "$step" --json --trace "$out/finetune-trace.json" > "$out/finetune.json" 2> "$out/finetune.txt"
rc=$?
cat "$out/finetune.txt"
echo "exit $rc"
[ $rc = 0 ] || status=1

echo "== out of memory: batch 16 x seq 8192 (the baseline must not fit, exit 3)"
timeout 180 "$step" --batch 16 --seq 8192 --steps 3 2>&1 | tee "$out/finetune-oom.txt"
rc=$?
echo "exit $rc"
[ $rc = 3 ] && grep -q "did not fit" "$out/finetune-oom.txt" || status=1
exit $status
