"""The multi-GPU rows of issue 37, run by scripts/gpu/vocab-parallel.sh under torchrun: kjit's
vocab-parallel cross-entropy (forward + backward) at TP = world size against kjit.torch's
cross_entropy on the whole vocab on one GPU (TP=1), and the cost of its two all-reduces alone.

    torchrun --nproc-per-node 4 scripts/gpu/vocab_parallel_bench.py --vocab 128256 --rows 16384

Rank 0 prints one JSON line: per configuration the median milliseconds of a step and tokens per
second per GPU; "tp_over_tp1" is TP's tokens/s per GPU over TP=1's (1.0: linear scaling).
"""

import argparse
import json
import os
import statistics

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

import kjit.torch
from kjit.torch.distributed import shard_of, vocab_parallel_cross_entropy


def median_ms(fn, repeats: int, together: bool = True) -> float:
    """The median time of fn on the current stream; `together`: all ranks start each repeat at
    once (a barrier first)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if together:
            dist.barrier()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank)
    torch.manual_seed(0)
    start, end = shard_of(args.vocab, rank, world)
    target = torch.randint(0, args.vocab, (args.rows,), device=device)
    shard = torch.randn(args.rows, end - start, device=device, dtype=torch.bfloat16)

    def tp_step():
        logits = shard.clone().requires_grad_()
        vocab_parallel_cross_entropy(logits, target, vocab_start=start,
                                     vocab=args.vocab).backward()

    stats = torch.randn(3 * args.rows, device=device)

    def collectives():
        funcol.all_reduce(stats[:args.rows], "max", dist.group.WORLD).wait()
        funcol.all_reduce(stats, "sum", dist.group.WORLD).wait()

    results = {"world": world, "vocab": args.vocab, "rows": args.rows,
               "gpu": torch.cuda.get_device_name(device)}
    results["tp_ms"] = median_ms(tp_step, args.repeats)
    results["all_reduces_ms"] = median_ms(collectives, args.repeats)
    if rank == 0:
        whole = torch.randn(args.rows, args.vocab, device=device, dtype=torch.bfloat16)

        def tp1_step():
            logits = whole.clone().requires_grad_()
            kjit.torch.cross_entropy(logits, target).backward()

        results["tp1_ms"] = median_ms(tp1_step, args.repeats, together=False)
        # A TP step takes `rows` tokens on `world` GPUs; a TP=1 step on one.
        results["tp_tokens_per_s_per_gpu"] = args.rows / (results["tp_ms"] / 1e3) / world
        results["tp1_tokens_per_s"] = args.rows / (results["tp1_ms"] / 1e3)
        results["tp_over_tp1"] = results["tp_tokens_per_s_per_gpu"] / results["tp1_tokens_per_s"]
    dist.barrier()
    if rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
