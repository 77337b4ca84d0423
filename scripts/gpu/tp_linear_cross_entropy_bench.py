"""Issue 50's multi-GPU rows, run by scripts/gpu/tp-linear-cross-entropy.sh under torchrun: kjit's
vocab-parallel fused lm_head + cross-entropy (forward + backward: d_hidden all-reduced, d_weight
shard) at TP = world size, against

  - tp1:          kjit.torch.linear_cross_entropy on the whole weight on one GPU (rank 0 alone);
  - tp_gather:    the unfused TP step that gathers the logits: each rank's logits slice, an
                  all-gather into the whole [rows, vocab] logits, kjit.torch.cross_entropy on them
                  (what a ColwiseParallel lm_head with use_local_output=True and a plain loss
                  does; its backward slices the gradient, as the all-gather's backward does);
  - tp_unfused:   each rank's logits slice and kjit's vocab-parallel cross-entropy on it (no
                  gather; the [rows, vocab / tp] logits in memory).

    torchrun --nproc-per-node 4 scripts/gpu/tp_linear_cross_entropy_bench.py --rows 8192

Rank 0 prints one JSON line: per configuration the median milliseconds of a step, tokens per
second per GPU and the peak memory a rank allocated in it; "tp_over_tp1" is the fused TP's tokens/s
per GPU over TP=1's (1.0: linear scaling). Exits 77 (skipped) when the node has fewer GPUs than
ranks. The vocab must divide by the world size (the gathered logits are equal slices).
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from vocab_parallel_bench import median_ms  # noqa: E402 (beside this script)


def timed(fn, repeats: int, together: bool = True) -> tuple:
    """(vocab_parallel_bench.median_ms of fn, the peak MiB allocated during it over what was
    allocated before)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = median_ms(fn, repeats, together)
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--dtype", choices=("bf16", "fp16", "fp32"), default="bf16")
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.device_count() < world:
        print(f"SKIPPED: {world} ranks need {world} GPUs; this node has "
              f"{torch.cuda.device_count()}")
        return 77
    if args.vocab % world:
        print(f"tp_linear_cross_entropy_bench: --vocab {args.vocab} must divide by {world}",
              file=sys.stderr)
        return 2
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = torch.device("cuda", local_rank)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]

    import kjit.torch
    from kjit.torch.distributed import (vocab_parallel_cross_entropy,
                                        vocab_parallel_linear_cross_entropy)

    torch.manual_seed(0)  # the same hidden states, targets and whole weight on every rank
    hidden = torch.randn(args.rows, args.hidden, device=device, dtype=dtype)
    target = torch.randint(0, args.vocab, (args.rows,), device=device)
    width = args.vocab // world
    start = rank * width
    weight = (torch.randn(args.vocab, args.hidden, device=device, dtype=dtype) /
              args.hidden ** 0.5)
    shard = weight[start:start + width].clone()
    del weight
    group = dist.group.WORLD

    def fused():
        h, w = hidden.clone().requires_grad_(), shard.clone().requires_grad_()
        vocab_parallel_linear_cross_entropy(h, w, target, group=group).backward()

    class Gather(torch.autograd.Function):
        """The logits slices all-gathered into [rows, vocab]; the backward keeps this rank's
        columns (DTensor's Shard(-1) -> Replicate and back)."""

        @staticmethod
        def forward(ctx, local):
            parts = funcol.all_gather_tensor(local, 0, group)  # [world * rows, width]
            parts = parts.wait() if hasattr(parts, "wait") else parts
            return parts.view(world, args.rows, width).permute(1, 0, 2).reshape(args.rows, -1)

        @staticmethod
        def backward(ctx, grad):
            return grad[:, start:start + width]

    def gathered():
        h, w = hidden.clone().requires_grad_(), shard.clone().requires_grad_()
        kjit.torch.cross_entropy(Gather.apply(h @ w.t()), target).backward()

    def unfused():
        h, w = hidden.clone().requires_grad_(), shard.clone().requires_grad_()
        local = h @ w.t()
        vocab_parallel_cross_entropy(local, target, group=group).backward()

    results = {"world": world, "vocab": args.vocab, "hidden": args.hidden, "rows": args.rows,
               "dtype": args.dtype, "gpu": torch.cuda.get_device_name(device)}
    for name, fn in (("tp_fused", fused), ("tp_gather", gathered), ("tp_unfused", unfused)):
        results[f"{name}_ms"], results[f"{name}_peak_mib"] = timed(fn, args.repeats)
        results[f"{name}_tokens_per_s_per_gpu"] = \
            args.rows / (results[f"{name}_ms"] / 1e3) / world
    del shard
    if rank == 0:
        whole = torch.randn(args.vocab, args.hidden, device=device, dtype=dtype)

        def tp1():
            h, w = hidden.clone().requires_grad_(), whole.clone().requires_grad_()
            kjit.torch.linear_cross_entropy(h, w, target).backward()

        results["tp1_ms"], results["tp1_peak_mib"] = timed(tp1, args.repeats, together=False)
        results["tp1_tokens_per_s"] = args.rows / (results["tp1_ms"] / 1e3)
        results["tp_over_tp1"] = (results["tp_fused_tokens_per_s_per_gpu"] /
                                  results["tp1_tokens_per_s"])
        results["fused_over_gather"] = results["tp_gather_ms"] / results["tp_fused_ms"]
        del whole
    dist.barrier()
    if rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
