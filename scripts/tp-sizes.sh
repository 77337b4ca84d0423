# Sourced by the multi-GPU TP benchmarks (gpu-vocab-parallel.sh, gpu-tp-linear-cross-entropy.sh):
#   tp_sizes NAME [sizes...]   sets the array `sizes` (default 2 4 8); exits 2 on one that is not
#                              a number, 77 (skipped) when the machine has fewer GPUs than the
#                              largest, before anything runs; turns NVLink multicast off (a
#                              program using it can take the host's shared GPUs down)
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
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
}

torchrun_each() {
  local n status=0
  for n in "${sizes[@]}"; do
    "${python:-python3}" -m torch.distributed.run --standalone --nproc-per-node "$n" "$@" ||
      status=1
  done
  return $status
}
