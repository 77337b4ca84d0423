"""kjit's vocab-parallel cross-entropy steps as torch.library custom ops ("kjit::sharded_...").

The per-shard halves of kjit.torch.distributed's vocab-parallel cross-entropy on CUDA tensors:
compute_stats writes a shard's per-row statistics into a workspace (a uint8 tensor of
ShardedCrossEntropy.workspace_bytes(rows)), and the statistics are views of it
(max_of, sums_of) that kjit.torch.distributed all-reduces through torch.distributed; rescale and
finish take the reduced tensors and return new workspaces and outputs (functional, so that
torch.compile traces them; the copies are O(rows), not O(rows x vocab)). Each launches on the
current stream and allocates through torch only.

    ws = KJIT_KERNELS.stats(local_logits, target, None, spec, True)  # True: lse of every row
    mx = all_reduce(KJIT_KERNELS.max_of(ws, spec, rows), "max", group)
    ws = KJIT_KERNELS.rescale(ws, mx, spec)
    sums = all_reduce(KJIT_KERNELS.sums_of(ws, spec, rows), "sum", group)
    loss, lse, grad = KJIT_KERNELS.finish(local_logits, target, None, ws, sums, None, False, spec)
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from kjit._loss_options import SCHEMA as LOSS_SCHEMA
from kjit._loss_options import LossOptions
from kjit._runtime import ShardedCrossEntropy
from kjit.torch import _kernels


class ShardSpec(NamedTuple):
    """One rank's shard of the vocab and the loss options (all ranks pass the same options)."""
    vocab: int
    shard_start: int
    shard_end: int
    options: LossOptions

    def scalars(self) -> tuple:
        """The spec as the custom ops take it (_SPEC): the shard, then the options' fields."""
        return (self.vocab, self.shard_start, self.shard_end, *self.options)


def _spec_of(scalars: tuple) -> ShardSpec:
    vocab, shard_start, shard_end, *options = scalars
    return ShardSpec(vocab, shard_start, shard_end, LossOptions(*options))


_SPEC = f"int vocab, int shard_start, int shard_end, {LOSS_SCHEMA}"


def _op(logits: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor],
        spec: ShardSpec) -> ShardedCrossEntropy:
    shard = dict(vocab=spec.vocab, shard_start=spec.shard_start, shard_end=spec.shard_end,
                 dtype=_kernels.dtype_name(logits, "logits"),
                 target_type=_kernels.index_name(target, "target"),
                 class_weight_dtype=None if weight is None else _kernels.dtype_name(weight,
                                                                                    "weight"))
    return _kernels.cached_op(
        logits.device, ("sharded_cross_entropy", spec.options, *shard.values()),
        lambda rt: rt.sharded_cross_entropy(**shard, **spec.options._asdict()))


# A nominal 16-byte aligned address: stats_of is arithmetic on the workspace's address, so the
# statistics' offsets come out the same for any base, a fake tensor's included.
_NOMINAL_BASE = 1 << 20
_offsets: dict = {}


def _stats_offsets(op, rows: int) -> tuple:
    """(bytes to max, bytes to sums) in a workspace of `op` for `rows` rows."""
    key = (id(op), rows)
    found = _offsets.get(key)
    if found is None:
        max_at, sums_at = op.stats_of(_NOMINAL_BASE, rows)
        found = _offsets[key] = (max_at - _NOMINAL_BASE, sums_at - _NOMINAL_BASE)
    return found


def _workspace_like(op, rows: int, device) -> torch.Tensor:
    return torch.empty(op.workspace_bytes(rows), dtype=torch.uint8, device=device)


def _loss_like(rows: int, reduction: str, device) -> torch.Tensor:
    return torch.empty((rows,) if reduction == "none" else (1,), dtype=torch.float32,
                       device=device)


def _fields(op, logits, target, weight, workspace, loss):
    return dict(logits=_kernels.as_matrix(logits, "logits"),
                targets=_kernels.as_index(target, "target"), loss=_kernels.as_vector(loss),
                class_weight=_kernels.as_vector(weight), workspace=workspace.data_ptr(),
                workspace_bytes=workspace.numel())


@_kernels._kernel("sharded_cross_entropy_stats", mutates_args=(),
                  schema=f"(Tensor logits, Tensor target, Tensor? weight, bool lse, {_SPEC}) "
                         "-> Tensor")
def _stats(logits, target, weight, lse, *spec):
    """The shard's statistics and the valid-row count, in a new workspace. lse: whether finish's
    lse is wanted for every row: the kernel reads an ignored row (target ignore_index or outside
    the vocab) only when given an lse vector, as cross_entropy_forward does; without, such a
    row's statistics are empty and finish's lse of it is -inf (its loss and gradient are 0
    either way)."""
    spec = _spec_of(spec)
    op = _op(logits, target, weight, spec)
    rows = logits.shape[0]
    workspace = _workspace_like(op, rows, logits.device)
    # (checked here, written by finish only; phase 1 only tests the lse pointer)
    loss = _loss_like(rows, spec.options.reduction, logits.device)
    fields = _fields(op, logits, target, weight, workspace, loss)
    if lse:
        fields.update(lse=_kernels.as_vector(
            torch.empty(rows, dtype=torch.float32, device=logits.device)))
    op.compute_stats(_kernels._stream(logits.device), **fields)
    return workspace


@_stats.register_fake
def _(logits, target, weight, lse, *spec):
    return _workspace_like(_op(logits, target, weight, _spec_of(spec)), logits.shape[0],
                           logits.device)


def _with(workspace: torch.Tensor, offset: int, values: torch.Tensor) -> torch.Tensor:
    """A copy of `workspace` with fp32 `values` written at byte `offset`."""
    out = workspace.clone()
    out.narrow(0, offset, 4 * values.numel()).view(torch.float32).copy_(values)
    return out


@_kernels._kernel("sharded_cross_entropy_rescale", mutates_args=(),
                  schema="(Tensor workspace, Tensor max, Tensor logits, Tensor target, "
                         f"Tensor? weight, {_SPEC}) -> Tensor")
def _rescale(workspace, max, logits, target, weight, *spec):
    """A new workspace holding the all-reduced `max` and the shard's sums rescaled to it
    (logits, target and weight only pick the op handle)."""
    op = _op(logits, target, weight, _spec_of(spec))
    rows = max.numel()
    out = _with(workspace, _stats_offsets(op, rows)[0], max)
    op.rescale_stats(_kernels._stream(out.device), out.data_ptr(), rows)
    return out


@_rescale.register_fake
def _(workspace, max, logits, target, weight, *spec):
    return torch.empty_like(workspace)


@_kernels._kernel("sharded_cross_entropy_finish", mutates_args=(),
                  schema="(Tensor logits, Tensor target, Tensor? weight, Tensor workspace, "
                         f"Tensor sums, Tensor? grad_output, bool grad, {_SPEC}) "
                         "-> (Tensor, Tensor, Tensor)")
def _finish(logits, target, weight, workspace, sums, grad_output, grad, *spec):
    """loss, lse and (when `grad`) the shard's gradient for upstream grad_output (1 when None),
    from a workspace whose sums become the all-reduced `sums`; else an empty gradient."""
    spec = _spec_of(spec)
    op = _op(logits, target, weight, spec)
    rows = logits.shape[0]
    out = _with(workspace, _stats_offsets(op, rows)[1], sums)
    loss = _loss_like(rows, spec.options.reduction, logits.device)
    lse = torch.empty(rows, dtype=torch.float32, device=logits.device)
    gradient = torch.empty(logits.shape if grad else (0,), dtype=logits.dtype,
                           device=logits.device)
    fields = _fields(op, logits, target, weight, out, loss)
    fields.update(lse=_kernels.as_vector(lse))
    if grad:
        fields.update(grad=_kernels.as_matrix(gradient, "grad"),
                      grad_output=_kernels.as_vector(grad_output))
    op.finish(_kernels._stream(logits.device), **fields)
    return loss, lse, gradient


@_finish.register_fake
def _(logits, target, weight, workspace, sums, grad_output, grad, *spec):
    rows = logits.shape[0]
    return (_loss_like(rows, _spec_of(spec).options.reduction, logits.device),
            torch.empty(rows, dtype=torch.float32, device=logits.device),
            torch.empty(logits.shape if grad else (0,), dtype=logits.dtype,
                        device=logits.device))


class KjitShardKernels:
    """The statistics contract kjit.torch.distributed combines, on kjit's kernels (CUDA)."""

    def stats(self, logits, target, weight, spec: ShardSpec, lse: bool = False) -> torch.Tensor:
        """lse: finish's lse is wanted for ignored rows too (else it is -inf there)."""
        return _stats(logits, target, weight, bool(lse), *spec.scalars())

    def max_of(self, workspace, logits, target, weight, spec: ShardSpec) -> torch.Tensor:
        return self._view(workspace, logits, target, weight, spec, 0, 1)

    def sums_of(self, workspace, logits, target, weight, spec: ShardSpec) -> torch.Tensor:
        return self._view(workspace, logits, target, weight, spec, 1, 3)

    def rescale(self, workspace, max, logits, target, weight, spec: ShardSpec) -> torch.Tensor:
        return _rescale(workspace, max, logits, target, weight, *spec.scalars())

    def finish(self, logits, target, weight, workspace, sums, grad_output, grad: bool,
               spec: ShardSpec) -> tuple:
        return _finish(logits, target, weight, workspace, sums, grad_output, grad,
                       *spec.scalars())

    @staticmethod
    def _view(workspace, logits, target, weight, spec, which: int, per_row: int):
        rows = logits.shape[0]
        offset = _stats_offsets(_op(logits, target, weight, spec), rows)[which]
        return workspace.narrow(0, offset, 4 * per_row * rows).view(torch.float32)


KJIT_KERNELS = KjitShardKernels()
