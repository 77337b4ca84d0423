"""kjit under torchrun: a vocab-parallel (tensor-parallel) lm_head's loss, and FSDP2 with the fused
lm_head + loss. Runs on CUDA GPUs; several processes may share one GPU (use --backend gloo then).

    # TP: lm_head's columns (the vocab) split over the ranks, the loss from kjit's
    # vocab-parallel cross-entropy, checked against kjit's cross-entropy on the whole logits
    torchrun --nproc-per-node 2 examples/torch_distributed.py tp
    # the same with 2 processes on one GPU
    torchrun --nproc-per-node 2 examples/torch_distributed.py tp --backend gloo
    # FSDP2: a tiny random LLaMA (needs transformers), fully_shard on each layer and the model,
    # apply_to(linear_cross_entropy=True), a few steps beside the same model without kjit
    torchrun --nproc-per-node 2 examples/torch_distributed.py fsdp

Each rank prints one JSON line; the exit status is 1 when a check fails.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

import kjit.torch
from kjit.torch.distributed import vocab_parallel_cross_entropy


def tensor_parallel(args, device) -> dict:
    """lm_head under ColwiseParallel (its output a DTensor sharded on the vocab), the loss and
    hidden's gradient from kjit's vocab-parallel cross-entropy, against kjit.torch.cross_entropy
    on the whole logits."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    torch.manual_seed(0)  # the same weights, hidden states and targets on every rank
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    lm_head = torch.nn.Linear(args.hidden, args.vocab, bias=False, device=device,
                              dtype=torch.bfloat16)
    whole = lm_head.weight.detach().clone()
    parallelize_module(lm_head, mesh, ColwiseParallel(use_local_output=False))
    hidden = torch.randn(args.rows, args.hidden, device=device, dtype=torch.bfloat16,
                         requires_grad=True)
    target = torch.randint(0, args.vocab, (args.rows,), device=device)
    target[::7] = -100

    logits = lm_head(hidden)  # a DTensor [rows, vocab], placements (Shard(-1),)
    loss = vocab_parallel_cross_entropy(logits, target, label_smoothing=0.1, z_loss=1e-4)
    loss.backward()  # a replicated DTensor: every rank holds the whole loss

    reference_hidden = hidden.detach().clone().requires_grad_()
    reference = kjit.torch.cross_entropy(reference_hidden @ whole.T, target,
                                         label_smoothing=0.1, z_loss=1e-4)
    reference.backward()
    loss_error = abs(loss.to_local().item() - reference.item()) / abs(reference.item())
    grad_error = ((hidden.grad.float() - reference_hidden.grad.float()).abs().max() /
                  reference_hidden.grad.float().abs().max()).item()
    return {"loss": loss.to_local().item(), "reference": reference.item(),
            "loss_rel_error": loss_error, "d_hidden_rel_error": grad_error,
            "ok": loss_error < 1e-3 and grad_error < 2e-2}


def fsdp(args, device) -> dict:
    """A tiny random LLaMA under FSDP2 with kjit's fused lm_head + loss: lm_head stays in the
    model's fully_shard unit (a unit of its own is refused), so its weight is whole when the loss
    runs."""
    import transformers
    from torch.distributed.fsdp import fully_shard

    def model():
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                                          intermediate_size=2 * args.hidden,
                                          num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2)
        m = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
        return m

    def train(m, with_kjit):
        if with_kjit:
            kjit.torch.apply_to(m, linear_cross_entropy=True)
        for layer in m.model.layers:
            fully_shard(layer)
        fully_shard(m)  # lm_head and the norms in the root unit
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        torch.manual_seed(1)
        ids = torch.randint(0, args.vocab, (2, args.rows // 2), device=device)
        losses = []
        for _ in range(args.steps):
            opt.zero_grad()
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    plain, fused = train(model(), False), train(model(), True)
    worst = max(abs(a - b) / abs(b) for a, b in zip(fused, plain))
    return {"losses": fused, "without_kjit": plain, "max_rel_difference": worst,
            "ok": worst < 2e-2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("tp", "fsdp"))
    parser.add_argument("--backend", default="nccl", help="nccl (a GPU a rank) or gloo")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_distributed.py: kjit's kernels need a CUDA GPU", file=sys.stderr)
        return 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group(args.backend)
    try:
        result = (tensor_parallel if args.mode == "tp" else fsdp)(args, device)
    finally:
        dist.destroy_process_group()
    print(json.dumps({"rank": int(os.environ.get("RANK", "0")), "mode": args.mode, **result}))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
