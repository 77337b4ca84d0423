"""Vocab-parallel cross-entropy over torch.distributed, for tensor-parallel lm_heads; and the
lm_head fused in (vocab_parallel_linear_cross_entropy, at the end: the weight split over the
vocab, each rank's logits slice made chunk by chunk and never gathered).

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

from kjit.torch import _kernels
from kjit.torch._common import (LossOutput, add_chunk_grads, check_bias_and_dtypes,
                                checked_class_weight, extras_wanted, fp32_rows, is_dtensor,
                                kernel_extras, lm_head, loss_options, loss_output, rows_per_chunk,
                                same_device)
from kjit.torch._sharded_kernels import KJIT_KERNELS, ShardSpec

# The per-shard steps by device type: an object with stats, max_of, sums_of, rescale and finish
# (kjit.torch._sharded_kernels.KjitShardKernels says what each takes and returns).
SHARD_KERNELS = {"cuda": KJIT_KERNELS}


def _kernels_for(logits: torch.Tensor, what: str = "logits"):
    kernels = SHARD_KERNELS.get(logits.device.type)
    if kernels is None:
        raise ValueError(f"kjit: {what} must be CUDA tensors, got them on {logits.device}; "
                         "kjit's kernels run on NVIDIA GPUs only")
    return kernels


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, spec, group):
        kernels = _kernels_for(logits)
        # Without the lse (only the loss leaves vocab_parallel_cross_entropy) the kernels skip
        # ignored rows: their lse here is -inf, their loss and gradient 0.
        ws = kernels.stats(logits, target, weight, spec, False)
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
        shape = (logits.shape[0],) if spec.options.reduction == "none" else (1,)
        grad_output = fp32_rows(grad_loss, shape)
        _, _, grad = _kernels_for(logits).finish(logits, target, weight, ws, sums, grad_output,
                                                 True, spec)
        return grad, None, None, None, None


def _dtensor_types():
    from torch.distributed.tensor import DTensor, Replicate, Shard
    return DTensor, Replicate, Shard


def _replicated_local(t, what: str):
    """A DTensor that is replicated as its local tensor; a plain tensor as it is."""
    if t is None or not is_dtensor(t):
        return t
    _, Replicate, _ = _dtensor_types()
    if not all(isinstance(p, Replicate) for p in t.placements):
        raise ValueError(f"kjit: {what} must be replicated (every rank holds all of it), got a "
                         f"DTensor with placements {t.placements}; call .full_tensor() first")
    return t.to_local()


def _no_placement_with_dtensor(what: str, group, vocab_start, vocab) -> None:
    if group is not None or vocab_start is not None or vocab is not None:
        raise ValueError(f"kjit: {what} is a DTensor: its mesh gives the group and its shape the "
                         "vocab; pass group, vocab_start and vocab only with local shards")


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
                       default_start: bool, *, op: str = "vocab_parallel_cross_entropy",
                       extra: tuple = (), slice_is: str = "its logits' columns") -> None:
    """Before the statistics: one all-reduce (the sum of a [ranks, 10 + len(extra)] float64 table
    in which each rank fills its own row) gives every rank every rank's slice, vocab, row count and
    options. Each rank checks them alike and raises the same ValueError where the slices overlap,
    leave a gap or overrun the vocab (the statistics would combine into a wrong loss) or the rest
    differs (a row count that differs would hang the all-reduces). `extra`: more (name, show,
    value) fields every rank must pass alike (`op`'s own: value a float, show how to print it);
    `slice_is` says in errors what a slice's width is."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    options = spec.options
    mine = [spec.shard_start, spec.shard_end, spec.vocab, rows, options.ignore_index,
            _REDUCTION_CODES.index(options.reduction), options.label_smoothing, options.z_loss,
            options.softcap, float(has_weight)] + [float(value) for _, _, value in extra]
    fields = _SAME_ON_EVERY_RANK + tuple((name, show) for name, show, _ in extra)
    table = torch.zeros(world, len(mine), dtype=torch.float64, device=device)
    table[rank] = torch.tensor(mine, dtype=torch.float64)
    dist.all_reduce(table, group=group)
    records = table.tolist()
    hint = (" By default rank r's slice starts at r * width and the vocab is width * ranks; with "
            "slices of unequal widths pass vocab_start and vocab." if default_start else "")
    for column, (name, show) in enumerate(fields, start=2):
        values = [record[column] for record in records]
        if any(v != values[0] for v in values):
            raise ValueError(f"kjit: {op}'s ranks disagree on {name} "
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
                         f"a slice is [vocab_start, vocab_start + {slice_is})).{hint}")


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
    if is_dtensor(logits):
        _no_placement_with_dtensor("logits", group, vocab_start, vocab)
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
    options = loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    _kernels.dtype_name(local, "logits")
    _kernels.index_name(target, "target")
    _kernels_for(local)
    flat = local.reshape(-1, local.shape[-1])
    _kernels.matrix_shape(flat, "logits")
    flat_target = target.reshape(-1)
    flat_target = flat_target if flat_target.is_contiguous() else flat_target.contiguous()
    same_device("target", flat_target, flat)
    if weight is not None:
        weight = checked_class_weight(weight, flat, vocab)
    spec = ShardSpec(int(vocab), int(start), int(end), options)
    if not torch.compiler.is_compiling():
        _check_ranks_agree(group, spec, flat.shape[0], weight is not None, flat.device,
                           vocab_start is None and mesh is None)
    loss, _ = _VocabParallelCrossEntropy.apply(flat, flat_target, weight, spec, group)
    loss = loss.reshape(target.shape) if options.reduction == "none" else loss.reshape(())
    if mesh is not None:
        DTensor, Replicate, _ = _dtensor_types()
        return DTensor.from_local(loss, mesh, [Replicate()], run_check=False)
    return loss


# ---- The lm_head fused in: vocab-parallel linear cross-entropy ----------------------------------

def _waited(t: torch.Tensor) -> torch.Tensor:
    """A functional collective's result as a plain tensor (eager: waits for it)."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


_CLASS_BITS = 21  # a class index in an argmax key (the sharded ops take vocab <= 2^20)


def _argmax_key(logits: torch.Tensor, start: int) -> torch.Tensor:
    """Per row, a float64 key whose max over the ranks is the lexicographic max of (logit,
    -class): the row's largest logit and, among equal ones, the first class, as torch.argmax
    picks on the whole row. Exact: the fp32 value's order as an integer in [0, 2^32), then the
    class in 21 bits, 53 bits in all."""
    local = logits.argmax(dim=1)
    value = logits.gather(1, local[:, None])[:, 0].float()
    bits = value.view(torch.int32).to(torch.int64)
    order = torch.where(bits < 0, -(bits + (1 << 31)), bits) + (1 << 31)  # -0.0 ties +0.0
    return (order * (1 << _CLASS_BITS) + ((1 << _CLASS_BITS) - 1 - (local + start))).double()


def _argmax_of_key(key: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    mask = (1 << _CLASS_BITS) - 1
    return (mask - (key.to(torch.int64) & mask)).to(dtype)


def _capped_fp32(logits: torch.Tensor, softcap: float) -> torch.Tensor:
    x = logits.float()
    return softcap * torch.tanh(x / softcap) if softcap else x


def _owned_target_logit(logits: torch.Tensor, target: torch.Tensor, start: int,
                        softcap: float) -> torch.Tensor:
    """Per row, the (capped, fp32) target logit where this shard holds the target, else 0."""
    local = target.long() - start
    inside = (local >= 0) & (local < logits.shape[1])
    picked = logits.gather(1, local.clamp(0, logits.shape[1] - 1)[:, None])[:, 0]
    return torch.where(inside, _capped_fp32(picked, softcap), 0.0)


class _VocabParallelLinearCrossEntropy(torch.autograd.Function):
    """Over chunks of rows: this shard's logits (hidden @ weight_shard.T + bias_shard), the sharded
    cross-entropy's statistics and their two all-reduces, the per-row loss; the backward recomputes
    each chunk's logits and forms this shard's gradient from the saved statistics."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, class_weight, spec, reduction, group, chunk,
                wanted, reduce_hidden, accumulation, grad_enabled):
        # spec's reduction is "none": each chunk's per-row loss, reduced over all rows here.
        ctx.reduction = reduction
        kernels = _kernels_for(hidden, "hidden")
        # want_lse: the lse of every row, ignored ones too (as the unsharded op's, which computes
        # it whenever an extra is asked): the stats kernel reads ignored rows only then.
        want_argmax, want_entropy, want_logprob, want_lse = wanted
        rows = hidden.shape[0]
        outs = {name: [] for name in ("loss", "lse", "predicted", "entropy", "logprob")}
        saved = []
        for first in range(0, rows, chunk):
            t = target[first:first + chunk]
            logits = lm_head(hidden[first:first + chunk], weight, bias)
            ws = kernels.stats(logits, t, class_weight, spec, want_lse)
            row_max = kernels.max_of(ws, logits, t, class_weight, spec)
            # Our own extras ride along in the two all-reduces (no collective of their own).
            x = _capped_fp32(logits, spec.options.softcap) if want_entropy else None
            mine = ([x.max(dim=1).values] if want_entropy else []) + \
                ([_argmax_key(logits, spec.shard_start)] if want_argmax else [])
            if mine:
                reduced = _waited(funcol.all_reduce(
                    torch.stack([row_max.double(), *(m.double() for m in mine)]), "max", group))
                row_max, mine = reduced[0].to(row_max.dtype), list(reduced[1:])
            else:
                row_max = funcol.all_reduce(row_max, "max", group)
            ws = kernels.rescale(ws, row_max, logits, t, class_weight, spec)
            sums = kernels.sums_of(ws, logits, t, class_weight, spec)
            ours = []
            if want_entropy:  # this shard's sum of exp(x - M) x, M the whole row's max
                ours.append((torch.exp(x - mine[0].float()[:, None]) * x).sum(dim=1))
            if want_logprob:
                ours.append(_owned_target_logit(logits, t, spec.shard_start,
                                                spec.options.softcap))
            if ours:
                n = sums.numel()
                reduced = _waited(funcol.all_reduce(
                    torch.cat([sums, *(o.to(sums.dtype) for o in ours)]), "sum", group))
                sums, ours = reduced[:n], reduced[n:].reshape(len(ours), -1)
            else:
                sums = _waited(funcol.all_reduce(sums, "sum", group))
            loss, lse, _ = kernels.finish(logits, t, class_weight, ws, sums, None, False, spec)
            del logits, x
            saved += [ws, sums]
            outs["loss"].append(loss)
            outs["lse"].append(lse)
            if want_argmax:
                outs["predicted"].append(_argmax_of_key(mine[-1], target.dtype))
            if want_entropy:  # lse - E_p[x], E_p[x] = sum exp(x - M) x * exp(M - lse)
                lse64 = lse.double()
                outs["entropy"].append(
                    (lse64 - ours[0].double() * torch.exp(mine[0] - lse64)).float())
            if want_logprob:
                valid = _valid_rows(t, spec)
                outs["logprob"].append(torch.where(valid, ours[-1].float() - lse, 0.0))
        per_row, lse, predicted, entropy, logprob = (
            (o[0] if len(o) == 1 else torch.cat(o)) if o else
            torch.empty(0, dtype=target.dtype if name == "predicted" else torch.float32,
                        device=hidden.device) for name, o in outs.items())
        per_row = per_row.float()
        valid = _valid_rows(target, spec)
        w_t = None if class_weight is None else \
            class_weight.float()[torch.where(valid, target.long(), 0)]
        divisor = (valid.sum().float() if w_t is None else torch.where(valid, w_t, 0.0).sum())
        if ctx.reduction == "none":
            loss = per_row
        else:
            loss = per_row.sum()
            loss = loss / divisor if ctx.reduction == "mean" else loss
        want = [grad_enabled and ctx.needs_input_grad[i] for i in range(3)]
        ctx.want = want
        if any(want):
            ctx.save_for_backward(hidden, weight, bias, target, class_weight, divisor, *saved)
            ctx.spec, ctx.group, ctx.chunk = spec, group, chunk
            ctx.reduce_hidden, ctx.accumulation = reduce_hidden, accumulation
        ctx.mark_non_differentiable(lse, predicted, entropy, logprob)
        return loss, lse, predicted, entropy, logprob

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *unused):
        if not any(ctx.want) or grad_loss is None:
            return (None,) * 13
        hidden, weight, bias, target, class_weight, divisor, *saved = ctx.saved_tensors
        spec, chunk = ctx.spec, ctx.chunk
        want_h, want_w, want_b = ctx.want
        kernels = _kernels_for(hidden, "hidden")
        rows = hidden.shape[0]
        if ctx.reduction == "none":
            up = fp32_rows(grad_loss, (rows,))
        else:
            scale = grad_loss.detach().float().reshape(1)
            up = (scale / divisor if ctx.reduction == "mean" else scale).expand(rows).contiguous()
        whole = chunk >= rows
        in_dtype = ctx.accumulation == "output_dtype"
        d_hidden = torch.empty(hidden.shape, dtype=hidden.dtype, device=hidden.device) \
            if want_h else None
        d_weight = d_bias = None
        for i, first in enumerate(range(0, rows, chunk)):
            last = min(rows, first + chunk)
            h, t = hidden[first:last], target[first:last]
            logits = lm_head(h, weight, bias)
            _, _, g = kernels.finish(logits, t, class_weight, saved[2 * i], saved[2 * i + 1],
                                     up[first:last], True, spec)
            del logits
            if want_h:
                torch.mm(g, weight, out=d_hidden[first:last])
            d_weight, d_bias = add_chunk_grads(g, h, d_weight, d_bias, want_w, want_b, whole,
                                               in_dtype)
            del g
        if want_h and ctx.reduce_hidden:
            d_hidden = _waited(funcol.all_reduce(d_hidden, "sum", ctx.group))
        d_weight = d_weight.to(weight.dtype) if want_w else None
        d_bias = d_bias.to(bias.dtype) if want_b else None
        return (d_hidden, d_weight, d_bias) + (None,) * 10


def _valid_rows(target: torch.Tensor, spec: ShardSpec) -> torch.Tensor:
    t = target.long()
    return (t != spec.options.ignore_index) & (t >= 0) & (t < spec.vocab)


def _replicated_input(t, what: str, partial_grad: bool):
    """A replicated DTensor as its local tensor, whose gradient goes back Partial (each rank's
    part, summed where DTensor redistributes it) when partial_grad; a plain tensor as it is."""
    if not partial_grad or not is_dtensor(t):
        return _replicated_local(t, what)
    _replicated_local(t, what)  # (the check)
    from torch.distributed.tensor import Partial
    return t.to_local(grad_placements=[Partial()])


def _sharded_on_rows(t, mesh, what: str):
    """t's local shard when t is a DTensor Shard(0) on `mesh`, else ValueError."""
    _, _, Shard = _dtensor_types()
    if not is_dtensor(t) or t.device_mesh != mesh or len(t.placements) != 1 or \
            not isinstance(t.placements[0], Shard) or t.placements[0].dim != 0:
        got = (f"placements {t.placements} on a {t.device_mesh.ndim}-D mesh"
               if is_dtensor(t) else "a plain tensor")
        raise ValueError(f"kjit: {what} must be a DTensor sharded on dim 0 (placements "
                         f"(Shard(0),)) on weight's 1-D mesh, as ColwiseParallel shards lm_head; "
                         f"got {got} (or pass local shards and a group)")
    return t.to_local()


_HIDDEN_GRAD = ("none", "all-reduced", "left partial")


def _extras_shown(code: float) -> str:
    names = [name for bit, name in enumerate(("predicted", "entropy", "target_logprob"))
             if int(code) >> bit & 1]
    return "+".join(names) or "none"


def vocab_parallel_linear_cross_entropy(
        hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
        bias: Optional[torch.Tensor] = None, *, group: Optional[dist.ProcessGroup] = None,
        vocab_start: Optional[int] = None, vocab: Optional[int] = None, ignore_index: int = -100,
        reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
        softcap: Optional[float] = None, class_weight: Optional[torch.Tensor] = None,
        extras=False, chunk_rows: Optional[int] = None, reduce_hidden_grad: bool = True,
        weight_grad_accumulation: str = "fp32"):
    """kjit.torch.linear_cross_entropy(hidden, weight, target, bias, ...) for a lm_head split over
    the vocab across the ranks of a process group (tensor parallelism, ColwiseParallel's or
    Megatron's column-parallel lm_head): the loss every rank gets is the single-GPU op's on the
    whole weight, and no rank ever holds logits wider than its slice of the vocab.

    - weight: a DTensor [vocab, hidden_size] whose placements are (Shard(0),) on a 1-D device mesh
      (lm_head's weight under ColwiseParallel; bias then a DTensor Shard(0) on the same mesh; the
      loss comes back a DTensor replicated on the mesh), or this rank's local rows [width,
      hidden_size] (and bias [width]) with `group` (None: the default group): classes
      [vocab_start, vocab_start + width) of `vocab`, by default vocab_start = rank * width and
      vocab = width * world size (equal slices, as Megatron splits).
    - hidden [..., hidden_size] and target [...] (class indices of the whole vocab) are the same on
      every rank (plain tensors, or DTensors replicated on the mesh); hidden, weight and bias
      share one dtype (float32, float16 or bfloat16). class_weight: the whole [vocab] weights.
    - ignore_index, reduction ("none" gives target's shape), label_smoothing (over the whole
      vocab), z_loss, softcap and class_weight as kjit.torch.linear_cross_entropy's, computed on
      the logits in the weight's dtype with the loss in fp32. Every rank must pass the same
      options, rows and hidden_size: they meet in the all-reduces.
    - extras: as linear_cross_entropy's (a LossOutput): lse, predicted (the argmax over the whole
      vocab, the first of equal logits), entropy, target_logprob and their reductions. Per-row
      fields have target's shape. predicted and entropy cost torch passes over each chunk's
      logits (fp32) and ride in the all-reduces below (the max one then in float64): no
      collective of their own.
    - How: for each chunk of chunk_rows rows (default: the chunk's logits slice takes at most
      512 MiB; the same on every rank), logits = hidden_chunk @ weight_shard.T + bias_shard
      (torch's GEMM, autocast off: cast hidden and weight first), the sharded cross-entropy's
      per-row statistics of the slice (kjit's kernels, SHARD_KERNELS as
      vocab_parallel_cross_entropy's), combined across the ranks by two all-reduces (the row max:
      chunk floats, then 3 floats a row), then each row's loss. Collectives: one check (below),
      2 per chunk in the forward, and in the backward one all-reduce of d_hidden
      ([rows, hidden_size], in hidden's dtype) when hidden needs a gradient and
      reduce_hidden_grad (default).
    - Autograd: the backward recomputes each chunk's logits and forms this shard's gradient from
      the saved statistics (the upstream gradient is read then, on the device): d_weight and
      d_bias are this rank's rows only (no collective: each rank updates its own shard), summed
      over the chunks in fp32 and rounded to the weight's dtype once (weight_grad_accumulation
      "output_dtype": in the dtype, no fp32 accumulator). d_hidden sums this shard's part over
      the ranks in one all-reduce; reduce_hidden_grad=False leaves each rank its part (a
      replicated DTensor hidden then gets a Partial gradient, which DTensor reduces where it is
      redistributed, as ColwiseParallel's input gradient is; a plain hidden's gradient must be
      summed over the group by the caller, e.g. a sequence-parallel reduce-scatter).
    - Memory per rank, with R ranks, V vocab, H hidden_size, b the dtype's bytes and C chunk_rows
      (tests/python/test_tp_lce_cpu.py counts it in fp32): forward C*(V/R)*b (one chunk's logits)
      + 32 bytes a row of statistics kept for the backward (+ 8*C*(V/R) with the entropy extra,
      and 4*C*(V/R) more for its fp32 copy of the logits unless they are fp32 without softcap);
      backward C*(V/R)*b (a chunk's logit gradient) + the larger of C*(V/R)*b (its logits) and
      4*(V/R)*H (its fp32 d_weight product, added to the accumulator from the second chunk on)
      + 4*(V/R)*H (the fp32 d_weight accumulator, when there is more than one chunk; in fp32 it
      is d_weight; "output_dtype" has neither) besides the gradients themselves (d_hidden
      rows*H*b, twice while it is all-reduced; d_weight (V/R)*H*b): no term in rows*(V/R)
      besides O(rows).
    - Before the first collective one all-reduce ([ranks, 15] float64, read on the host) checks
      that the ranks' slices tile the vocab once and that their vocab, rows, hidden_size,
      chunk_rows, options, bias, extras and whether hidden's gradient is reduced agree: else every
      rank raises the same ValueError rather than combining into a wrong loss or hanging. A call
      torch.compile traces skips it.
    """
    for what, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"kjit: bias must be a torch.Tensor or None, got {type(bias).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"kjit: weight must be [vocab, hidden_size] (a shard: [width, "
                         f"hidden_size]), got shape {tuple(weight.shape)}")
    if not isinstance(reduce_hidden_grad, bool):
        raise TypeError(f"kjit: reduce_hidden_grad must be a bool, got {reduce_hidden_grad!r}")
    mesh = None
    if is_dtensor(weight):
        _no_placement_with_dtensor("weight", group, vocab_start, vocab)
        mesh = weight.device_mesh
        if mesh.ndim != 1:
            raise ValueError(f"kjit: weight must be sharded on a 1-D mesh, got a {mesh.ndim}-D "
                             "one (pass local shards and a group)")
        local_weight = _sharded_on_rows(weight, mesh, "weight")
        local_bias = None if bias is None else _sharded_on_rows(bias, mesh, "bias")
        group = mesh.get_group()
        vocab = weight.shape[0]
        start, end = shard_of(vocab, mesh.get_local_rank(), mesh.size())
        if local_weight.shape[0] != end - start:
            raise ValueError(f"kjit: this rank's weight holds {local_weight.shape[0]} rows, but "
                             f"Shard(0) of {vocab} gives it [{start}, {end}); the DTensor is "
                             "unevenly sharded")
    else:
        if bias is not None and is_dtensor(bias):
            raise ValueError("kjit: bias is a DTensor but weight is not: pass both as DTensors "
                             "or both as local shards")
        group = group if group is not None else dist.group.WORLD
        local_weight, local_bias = weight, bias
        width = local_weight.shape[0]
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        start = rank * width if vocab_start is None else int(vocab_start)
        vocab = width * world if vocab is None else int(vocab)
        end = start + width
    needs_hidden_grad = torch.is_grad_enabled() and hidden.requires_grad
    hidden = _replicated_input(hidden, "hidden", not reduce_hidden_grad)
    target = _replicated_local(target, "target")
    class_weight = _replicated_local(class_weight, "class_weight")
    size = local_weight.shape[1]
    if hidden.dim() < 1 or hidden.shape[-1] != size:
        raise ValueError(f"kjit: hidden must be [..., hidden_size] = [..., {size}] (weight's "
                         f"columns), got shape {tuple(hidden.shape)}")
    if target.shape != hidden.shape[:-1]:
        raise ValueError(f"kjit: target must have hidden's shape without hidden_size, "
                         f"{tuple(hidden.shape[:-1])}, got {tuple(target.shape)}")
    if target.is_floating_point():
        raise TypeError("kjit: target must hold class indices (int64 or int32)")
    rows = target.numel()
    if rows == 0:
        raise ValueError("kjit: hidden has no rows; the op needs at least one")
    flat = hidden.reshape(rows, size)
    check_bias_and_dtypes(flat, local_weight, local_bias)
    _kernels.index_name(target, "target")
    _kernels_for(flat, "hidden")
    for what, t in (("weight", local_weight), ("target", target), ("bias", local_bias)):
        if t is not None:
            same_device(what, t, flat)
    options = loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    names = extras_wanted(extras)
    if weight_grad_accumulation not in ("fp32", "output_dtype"):
        raise ValueError("kjit: weight_grad_accumulation must be 'fp32' or 'output_dtype', got "
                         f"{weight_grad_accumulation!r}")
    flat_target = target.reshape(-1)
    flat_target = flat_target if flat_target.is_contiguous() else flat_target.contiguous()
    if class_weight is not None:
        class_weight = checked_class_weight(class_weight, flat, vocab, "class_weight")
    world = dist.get_world_size(group)
    chunk = rows_per_chunk(rows, -(-vocab // world), flat.dtype, chunk_rows)
    wanted = kernel_extras(names)
    spec = ShardSpec(int(vocab), int(start), int(end), options)
    if not torch.compiler.is_compiling():
        grad_code = 0 if not needs_hidden_grad else (1 if reduce_hidden_grad else 2)
        _check_ranks_agree(
            group, spec, rows, class_weight is not None, flat.device,
            vocab_start is None and mesh is None, op="vocab_parallel_linear_cross_entropy",
            slice_is="its weight's rows",
            extra=(("hidden_size", int, size), ("chunk_rows", int, chunk),
                   ("bias", lambda given: "given" if given else "none", local_bias is not None),
                   ("extras", _extras_shown, sum(int(w) << bit for bit, w in enumerate(wanted))),
                   ("hidden's gradient", lambda code: _HIDDEN_GRAD[int(code)], grad_code)))
    loss, *per_row = _VocabParallelLinearCrossEntropy.apply(
        flat, local_weight, local_bias, flat_target, class_weight,
        spec._replace(options=options._replace(reduction="none")), options.reduction, group,
        chunk, (*wanted, bool(names)), reduce_hidden_grad, weight_grad_accumulation,
        torch.is_grad_enabled())
    loss = loss.reshape(target.shape) if options.reduction == "none" else loss
    if names:
        out = loss_output(names, loss, flat_target, *per_row, vocab=vocab,
                          options=options, weight=class_weight)
        # (per-row fields in target's shape; built anew, as torch.compile traces a NamedTuple)
        out = LossOutput(*(
            value.reshape(target.shape) if value is not None and name != "loss" and
            value.dim() == 1 and value.shape[0] == rows else value
            for name, value in zip(out._fields, out)))
    else:
        out = loss
    if mesh is None:
        return out
    DTensor, Replicate, _ = _dtensor_types()

    def replicated(t):
        return None if t is None else DTensor.from_local(t, mesh, [Replicate()], run_check=False)

    if names:
        return LossOutput(*(replicated(t) for t in out))
    return replicated(out)
