"""Vocab-parallel cross-entropy over torch.distributed, for tensor-parallel lm_heads.

Each rank holds the logits of its slice of the vocab (a column-parallel lm_head's output). The loss
and each slice's gradient equal kjit.torch.cross_entropy's on the whole logits, as inside torch's
loss_parallel(): kjit's kernels compute each shard's per-row statistics, two all-reduces through
torch.distributed's functional collectives (so torch.compile traces them) combine them, kjit's
kernels finish the loss, and the gradient stays local (no collective in the backward).

    from torch.distributed.tensor import Shard
    from kjit.torch.distributed import vocab_parallel_cross_entropy
    # logits: a DTensor [rows, vocab] with placements (Shard(-1),) on a 1-D mesh, e.g. lm_head
    # under ColwiseParallel(use_local_output=False); the loss is a replicated DTensor
    loss = vocab_parallel_cross_entropy(logits, target, ignore_index=-100)
    # or local shards and a process group: rank r holds classes [r * width, (r + 1) * width)
    loss = vocab_parallel_cross_entropy(local_logits, target, group=tp_group)

The statistics contract (per row, in the workspace of kjit::ShardedCrossEntropy): each shard
computes its max and its sums (of exponentials relative to that max, of the weighted logits, and
its target logit); the max is all-reduced with max; each shard rescales its sum of exponentials to
the global max; the sums are all-reduced with sum; then each shard finishes the loss (the same on
every rank) and its gradient. The per-shard steps are pluggable by device type (SHARD_KERNELS):
kjit's kernels for "cuda"; the tests plug a float64 torch reference of the same contract in for
"cpu", so that the combining logic below runs over gloo on a machine without a GPU.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch.distributed import _functional_collectives as funcol

from kjit.torch import _kernels, functional
from kjit.torch._sharded_kernels import KJIT_KERNELS, ShardSpec

# The per-shard steps by device type: an object with stats, max_of, sums_of, rescale and finish
# (kjit.torch._sharded_kernels.KjitShardKernels says what each takes and returns).
SHARD_KERNELS = {"cuda": KJIT_KERNELS}


def _kernels_for(logits: torch.Tensor):
    kernels = SHARD_KERNELS.get(logits.device.type)
    if kernels is None:
        raise ValueError(f"kjit: logits must be CUDA tensors, got them on {logits.device}; "
                         "kjit's kernels run on NVIDIA GPUs only")
    return kernels


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, spec, group):
        kernels = _kernels_for(logits)
        ws = kernels.stats(logits, target, weight, spec)
        row_max = funcol.all_reduce(kernels.max_of(ws, logits, target, weight, spec), "max",
                                    group)
        ws = kernels.rescale(ws, row_max, logits, target, weight, spec)
        sums = funcol.all_reduce(kernels.sums_of(ws, logits, target, weight, spec), "sum", group)
        loss, lse, _ = kernels.finish(logits, target, weight, ws, sums, None, False, spec)
        ctx.save_for_backward(logits, target, weight, ws, sums)
        ctx.spec = spec
        ctx.mark_non_differentiable(lse)
        return loss, lse

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, _grad_lse):
        logits, target, weight, ws, sums = ctx.saved_tensors
        spec = ctx.spec
        shape = (logits.shape[0],) if spec.reduction == "none" else (1,)
        grad_output = functional._per_row(grad_loss, shape)
        _, _, grad = _kernels_for(logits).finish(logits, target, weight, ws, sums, grad_output,
                                                 True, spec)
        return grad, None, None, None, None


def _dtensor_types():
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return DTensor, Replicate, Shard


def _replicated_local(t, what: str):
    """A DTensor that is replicated as its local tensor; a plain tensor as it is."""
    if t is None or not functional._is_dtensor(t):
        return t
    _, Replicate, _ = _dtensor_types()
    if not all(isinstance(p, Replicate) for p in t.placements):
        raise ValueError(f"kjit: {what} must be replicated (every rank holds all of it), got a "
                         f"DTensor with placements {t.placements}; call .full_tensor() first")
    return t.to_local()


def shard_of(vocab: int, rank: int, world: int) -> tuple:
    """[start, end) of rank's classes when `vocab` is split as DTensor's Shard splits a dimension
    (torch.chunk: ceil(vocab / world) a rank, the last ones shorter or empty)."""
    chunk = -(-vocab // world)
    start = min(rank * chunk, vocab)
    return start, min(start + chunk, vocab)


# What every rank must pass alike, as _check_ranks_agree gathers it after each rank's slice
# [start, end): the name in errors and how a value is shown.
_SAME_ON_EVERY_RANK = (("vocab", int), ("rows", int), ("ignore_index", int),
                       ("reduction", lambda code: repr(_REDUCTION_CODES[int(code)])),
                       ("label_smoothing", float), ("z_loss", float), ("softcap", float),
                       ("class weights", lambda given: "given" if given else "none"))
_REDUCTION_CODES = ("none", "sum", "mean")
_RANKS_SHOWN = 8  # ranks an error lists, at most


def _by_rank(values: list) -> str:
    """"rank 0: v0, rank 1: v1, ..." for the first _RANKS_SHOWN ranks."""
    shown = ", ".join(f"rank {r}: {v}" for r, v in enumerate(values[:_RANKS_SHOWN]))
    return shown + (f", ... ({len(values)} ranks)" if len(values) > _RANKS_SHOWN else "")


def _check_ranks_agree(group, spec: ShardSpec, rows: int, has_weight: bool, device,
                       default_start: bool) -> None:
    """Before the statistics: one all-reduce (the sum of a [ranks, 10] float64 table in which each
    rank fills its own row) gives every rank every rank's slice, vocab, row count and options. Each
    rank checks them alike and raises the same ValueError where the slices overlap, leave a gap or
    overrun the vocab (the statistics would combine into a wrong loss) or the rest differs (a row
    count that differs would hang the all-reduces)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    mine = [spec.shard_start, spec.shard_end, spec.vocab, rows, spec.ignore_index,
            _REDUCTION_CODES.index(spec.reduction), spec.label_smoothing, spec.z_loss,
            spec.softcap, float(has_weight)]
    table = torch.zeros(world, len(mine), dtype=torch.float64, device=device)
    table[rank] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(table, group=group)
    records = table.tolist()
    hint = (" By default rank r's slice starts at r * width and the vocab is width * ranks; with "
            "slices of unequal widths pass vocab_start and vocab." if default_start else "")
    for column, (name, show) in enumerate(_SAME_ON_EVERY_RANK, start=2):
        values = [record[column] for record in records]
        if any(v != values[0] for v in values):
            raise ValueError(f"kjit: vocab_parallel_cross_entropy's ranks disagree on {name} "
                             f"({_by_rank([show(v) for v in values])}); every rank must pass "
                             "the same rows, vocab and options, which meet in the all-reduces."
                             + (hint if name == "vocab" else ""))
    vocab = int(records[0][2])
    slices = [(int(record[0]), int(record[1])) for record in records]
    problem = None
    covered = 0
    for start, end, r in sorted((start, end, r) for r, (start, end) in enumerate(slices)):
        if not 0 <= start < end <= vocab:
            problem = f"rank {r}'s slice [{start}, {end}) is " + (
                "empty" if end <= start else "not inside the vocab")
        elif start > covered:
            problem = f"classes [{covered}, {start}) are on no rank"
        elif start < covered:
            problem = f"rank {r}'s slice [{start}, {end}) overlaps classes before {covered}"
        if problem:
            break
        covered = end
    if problem is None and covered < vocab:
        problem = f"classes [{covered}, {vocab}) are on no rank"
    if problem is not None:
        raise ValueError(f"kjit: the ranks' vocab slices must tile [0, {vocab}) once, but "
                         f"{problem} (slices {_by_rank([f'[{a}, {b})' for a, b in slices])}; "
                         f"a slice is [vocab_start, vocab_start + its logits' columns)).{hint}")


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                                 weight: Optional[torch.Tensor] = None, *,
                                 group: Optional[dist.ProcessGroup] = None,
                                 vocab_start: Optional[int] = None, vocab: Optional[int] = None,
                                 ignore_index: int = -100, reduction: str = "mean",
                                 label_smoothing: float = 0.0, z_loss: float = 0.0,
                                 softcap: Optional[float] = None):
    """F.cross_entropy over logits split on the vocab across the ranks of a process group, as
    kjit.torch.cross_entropy would compute it on the whole logits.

    - logits: a DTensor [..., vocab] whose placements are (Shard(-1),) on a 1-D device mesh (the
      loss is then a DTensor replicated on that mesh, as under loss_parallel()), or each rank's
      local [..., width] slice with `group` (None: the default group). Local slices are classes
      [vocab_start, vocab_start + width) of `vocab`; by default rank r's slice starts at
      r * width and vocab is width * world size (equal slices, as Megatron splits).
    - target: [...] class indices of the whole vocab, the same on every rank (a plain tensor or a
      replicated DTensor). weight: the whole [vocab] class weights (float32 or the logits'
      dtype), the same on every rank.
    - ignore_index, reduction ("none" gives target's shape), label_smoothing (over the whole
      vocab), z_loss and softcap as kjit.torch.cross_entropy's. Every rank must pass the same
      options: they meet in the all-reduces.
    - Autograd: the backward computes each rank's slice of the gradient from the saved statistics
      and logits (kept from the forward to the backward, as a torch op's would be) with the
      upstream gradient read on the device; no collective runs in the backward. The gradient
      has a buffer of its own (no in-place variant yet).
    - The forward runs two all-reduces (max: rows floats; sums: 3 * rows floats) through
      torch.distributed._functional_collectives, so torch.compile(fullgraph=True) traces them.
    - Before them one more all-reduce ([ranks, 10] float64, read on the host) checks that the
      ranks' slices tile the vocab once and that their vocab, row counts and options are the
      same: else every rank raises the same ValueError, rather than combining into a wrong loss
      or hanging. A call torch.compile traces skips it (its graph cannot read the result).
    """
    for what, t in (("logits", logits), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    if logits.dim() < 1:
        raise ValueError("kjit: logits must have a vocab dimension, got a 0-d tensor")
    mesh = None
    if functional._is_dtensor(logits):
        if group is not None or vocab_start is not None or vocab is not None:
            raise ValueError("kjit: logits is a DTensor: its mesh gives the group and its shape "
                             "the vocab; pass group, vocab_start and vocab only with local "
                             "shards")
        _, _, Shard = _dtensor_types()
        mesh = logits.device_mesh
        placements = logits.placements
        last = logits.dim() - 1
        if mesh.ndim != 1 or len(placements) != 1 or not isinstance(placements[0], Shard) or \
                placements[0].dim not in (-1, last):
            raise ValueError(f"kjit: a DTensor's logits must be sharded on the vocab dimension on "
                             f"a 1-D mesh, placements (Shard(-1),); got {placements} on a "
                             f"{mesh.ndim}-D mesh (redistribute, or pass local shards and a group)")
        group = mesh.get_group()
        vocab = logits.shape[-1]
        start, end = shard_of(vocab, mesh.get_local_rank(), mesh.size())
        local = logits.to_local()
        if local.shape[-1] != end - start:
            raise ValueError(f"kjit: this rank's logits hold {local.shape[-1]} classes, but "
                             f"Shard(-1) of {vocab} gives it [{start}, {end}); the DTensor is "
                             "unevenly sharded")
    else:
        group = group if group is not None else dist.group.WORLD
        local = logits
        width = local.shape[-1]
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        start = rank * width if vocab_start is None else int(vocab_start)
        vocab = width * world if vocab is None else int(vocab)
        end = start + width
    target = _replicated_local(target, "target")
    weight = _replicated_local(weight, "weight")
    if target.shape != local.shape[:-1]:
        raise ValueError(f"kjit: target must have the logits' shape without the vocab, "
                         f"{tuple(local.shape[:-1])}, got {tuple(target.shape)}")
    if target.is_floating_point():
        raise TypeError("kjit: target must hold class indices (int64 or int32)")
    ignore_index, reduction, label_smoothing, z_loss, softcap = functional._loss_options(
        ignore_index, reduction, label_smoothing, z_loss, softcap)
    _kernels.dtype_name(local, "logits")
    _kernels.index_name(target, "target")
    _kernels_for(local)
    flat = local.reshape(-1, local.shape[-1])
    _kernels.matrix_shape(flat, "logits")
    flat_target = target.reshape(-1)
    flat_target = flat_target if flat_target.is_contiguous() else flat_target.contiguous()
    functional._same_device("target", flat_target, flat)
    if weight is not None:
        weight = functional._class_weight(weight, flat, vocab)
    spec = ShardSpec(int(vocab), int(start), int(end), ignore_index, reduction, label_smoothing,
                     z_loss, softcap)
    if not torch.compiler.is_compiling():
        _check_ranks_agree(group, spec, flat.shape[0], weight is not None, flat.device,
                           vocab_start is None and mesh is None)
    loss, _ = _VocabParallelCrossEntropy.apply(flat, flat_target, weight, spec, group)
    loss = loss.reshape(target.shape) if reduction == "none" else loss.reshape(())
    if mesh is not None:
        DTensor, Replicate, _ = _dtensor_types()
        return DTensor.from_local(loss, mesh, [Replicate()], run_check=False)
    return loss
