"""What kjit.torch's modules share: argument checks, the loss options checked, LossOutput and
its extras, and the chunked lm_head's pieces (functional, rl and distributed use them)."""

from __future__ import annotations

import operator
import sys
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from kjit import _capi
from kjit._loss_options import LossOptions
from kjit.torch import _kernels


def check_cuda(what: str, t: torch.Tensor) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"kjit: {what} must be a CUDA tensor, got one on {t.device}; kjit's "
                         "kernels run on NVIDIA GPUs only")


def same_device(what: str, t: torch.Tensor, reference: torch.Tensor) -> None:
    if t.device != reference.device:
        raise ValueError(f"kjit: {what} is on {t.device} but the input is on {reference.device}")


def check_on_one_gpu(*named) -> None:
    """Each (name, tensor) pair is a CUDA tensor on the first one's device."""
    first = named[0][1]
    for what, t in named:
        check_cuda(what, t)
        same_device(what, t, first)


def is_dtensor(t) -> bool:
    """Whether t is a torch.distributed.tensor.DTensor (none exists unless its module was
    imported, so plain tensors cost a dict lookup)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(t, module.DTensor)


# What to do instead, by op, when a DTensor reaches it.
_DTENSOR_HINTS = {
    "cross_entropy": "for logits sharded on the vocab (Shard(-1), a column-parallel lm_head's "
                     "output) use kjit.torch.distributed.vocab_parallel_cross_entropy; otherwise "
                     "pass .full_tensor() (or .to_local() of a replicated DTensor)",
    "linear_cross_entropy": "under FSDP2 (fully_shard) call it where lm_head's weight is "
                            "unsharded (inside the forward of the fully_shard unit that holds "
                            "lm_head: kjit.torch.apply_to(model, linear_cross_entropy=True) does "
                            "when lm_head is not a unit of its own), or pass "
                            "weight.full_tensor(); for a vocab-parallel lm_head (weight "
                            "Shard(0) under tensor parallelism) use "
                            "kjit.torch.distributed.vocab_parallel_linear_cross_entropy",
    "rms_norm": "pass .full_tensor() (or .to_local() of a replicated DTensor)",
    "log_probs": "pass .full_tensor() (or .to_local() of a replicated DTensor); logits sharded "
                 "on the vocab have no kjit RL head yet",
    "linear_log_probs": "call it where lm_head's weight is unsharded, or pass "
                        "weight.full_tensor()",
}


def refuse_dtensors(op: str, *named) -> None:
    """TypeError naming the first (name, tensor) pair that is a DTensor: kjit's kernels take
    plain tensors, and a DTensor's local shard is not the tensor it stands for."""
    for what, t in named:
        if t is not None and is_dtensor(t):
            raise TypeError(f"kjit.torch.{op}: {what} is a DTensor (placements "
                            f"{tuple(t.placements)} on a mesh of {t.device_mesh.size()} ranks); "
                            f"kjit's kernels take plain tensors: {_DTENSOR_HINTS[op]}")


def integer_option(name: str, value) -> int:
    """An integer option (a Python or numpy int, a 0-d integer tensor): TypeError quoting what
    was given otherwise (a str, a float)."""
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"kjit: {name} must be an int, got {_capi.quoted(value)}") from None


def number_option(name: str, value) -> float:
    """A real-valued option (an int, a float, a 0-d tensor): TypeError quoting what was given
    otherwise (a str such as "0.1", which float() would take, is refused: pass the number)."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise TypeError(f"kjit: {name} must be a number (float), got {_capi.quoted(value)}")


_REDUCTIONS = ("none", "sum", "mean")


def loss_options(ignore_index: int, reduction: str, label_smoothing: float, z_loss: float,
                 softcap: Optional[float]) -> LossOptions:
    """The loss options every loss takes, checked alike, as the kernels take them (softcap None
    or 0 meaning off: 0)."""
    ignore_index = integer_option("ignore_index", ignore_index)
    label_smoothing, z_loss = (number_option("label_smoothing", label_smoothing),
                               number_option("z_loss", z_loss))
    softcap = None if softcap is None else number_option("softcap", softcap)
    if not isinstance(reduction, str) or reduction not in _REDUCTIONS:
        raise ValueError(f"kjit: reduction must be one of {_REDUCTIONS}, got "
                         f"{_capi.quoted(reduction)}")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"kjit: label_smoothing must be in [0, 1), got {label_smoothing}")
    if not z_loss >= 0:
        raise ValueError(f"kjit: z_loss must be >= 0, got {z_loss}")
    softcap = 0.0 if softcap is None else float(softcap)
    if not softcap >= 0:
        raise ValueError(f"kjit: softcap must be None or >= 0 (None or 0: off), got {softcap}")
    return LossOptions(int(ignore_index), reduction, float(label_smoothing), float(z_loss),
                       softcap)


def fp32_rows(t: torch.Tensor, shape) -> torch.Tensor:
    """A scalar or [rows] tensor as the contiguous fp32 [1] or [rows] the kernels read (the
    kernels take a 0-d tensor as [1]: the usual upstream gradient passes without a copy)."""
    if t.dtype == torch.float32 and t.numel() == shape[0] and t.is_contiguous():
        return t.detach()
    return t.detach().to(torch.float32).reshape(-1).expand(shape).contiguous()


def checked_class_weight(weight, logits: torch.Tensor, vocab: int,
                         what: str = "weight") -> torch.Tensor:
    """The class weights checked against the logits (or hidden states: their dtype and device),
    as the contiguous [vocab] vector the kernels read (a copy only when it is strided: it is
    small)."""
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"kjit: {what} must be a torch.Tensor or None, got {type(weight).__name__}")
    if weight.dim() != 1 or weight.shape[0] != vocab:
        raise ValueError(f"kjit: {what} must be a 1-D tensor of vocab = {vocab} class weights, "
                         f"got shape {tuple(weight.shape)}")
    if weight.dtype not in (torch.float32, logits.dtype):
        raise TypeError(f"kjit: {what} must be float32 or the logits' dtype ({logits.dtype}), "
                        f"got {weight.dtype}")
    same_device(what, weight, logits)
    return weight.detach().contiguous()


def check_bias_and_dtypes(hidden: torch.Tensor, weight: torch.Tensor,
                          bias: Optional[torch.Tensor]) -> None:
    """lm_head's bias is [vocab], and hidden, weight and bias share one dtype kjit takes."""
    vocab = weight.shape[0]
    if bias is not None and (bias.dim() != 1 or bias.shape[0] != vocab):
        raise ValueError(f"kjit: bias must be [vocab] = [{vocab}], got shape {tuple(bias.shape)}")
    _kernels.dtype_name(hidden, "hidden")
    for what, t in (("weight", weight), ("bias", bias)):
        if t is not None and t.dtype != hidden.dtype:
            raise TypeError(f"kjit: {what} must have hidden's dtype ({hidden.dtype}), got "
                            f"{t.dtype}")


class LossOutput(NamedTuple):
    """What cross_entropy and linear_cross_entropy return when asked for extras (extras=True, or
    the names wanted): the loss as the plain call returns it, then the extras asked for, None
    for the others. Per-row fields are [rows], for every row (ignored ones too); the reductions
    are 0-d fp32 tensors over the valid rows (target not ignore_index and inside the vocab),
    computed on the device with no host synchronization. Only `loss` has a gradient: for each
    token's log-probability with its gradient (RL), use reduction="none", whose per-row loss is
    -log p(target) without label smoothing, z-loss or weights, and takes per-row upstream
    gradients.

    Peers' names: predicted is Liger-Kernel's predicted tokens (argmax of the logits),
    token_accuracy its token accuracy and TRL's mean_token_accuracy, mean_entropy TRL's entropy,
    z_loss Liger-Kernel's return_z_loss value."""
    loss: torch.Tensor
    lse: Optional[torch.Tensor] = None             # fp32 [rows]: log-sum-exp of the (capped) logits
    predicted: Optional[torch.Tensor] = None       # [rows], target's dtype: argmax of the logits
    entropy: Optional[torch.Tensor] = None         # fp32 [rows]: -sum p ln p of the softmax
    target_logprob: Optional[torch.Tensor] = None  # fp32 [rows]: x_t - lse; 0 for ignored rows
    token_accuracy: Optional[torch.Tensor] = None  # predicted == target, over the valid rows
    mean_entropy: Optional[torch.Tensor] = None    # entropy, averaged over the valid rows
    z_loss: Optional[torch.Tensor] = None          # the z-loss term's value, reduced as the loss
    num_tokens: Optional[torch.Tensor] = None      # int64: the valid rows


EXTRAS = LossOutput._fields[1:]


def extras_wanted(extras) -> frozenset:
    """The LossOutput fields asked for: none (False, None), all (True), or those named."""
    if extras is None or extras is False:
        return frozenset()
    if extras is True:
        return frozenset(EXTRAS)
    names = (extras,) if isinstance(extras, str) else extras
    wrong = f"kjit: extras must be True, False, None, a name or an iterable of names of {EXTRAS}"
    try:
        names = tuple(names)
    except TypeError:
        raise TypeError(f"{wrong}; got {_capi.quoted(extras)}") from None
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{wrong}; got {_capi.quoted(name)} among them")
    names = frozenset(names)
    unknown = sorted(names - set(EXTRAS))
    if unknown:
        raise ValueError(f"kjit: extras: unknown {', '.join(map(repr, unknown))}; the extras are "
                         f"{', '.join(EXTRAS)} (or True for all)")
    return names


def kernel_extras(names: frozenset) -> tuple:
    """(argmax, entropy, logprob): the per-row outputs the kernels write for `names`."""
    return ("predicted" in names or "token_accuracy" in names,
            "entropy" in names or "mean_entropy" in names, "target_logprob" in names)


def loss_output(names, loss, target, lse, argmax, entropy, logprob, *, vocab: int,
                options: LossOptions, weight: Optional[torch.Tensor]) -> LossOutput:
    """The LossOutput of the kernels' per-row outputs: reductions by torch ops on the device."""
    valid = (target != options.ignore_index) & (target >= 0) & (target < vocab)
    count = valid.sum()
    out = {}
    if "lse" in names:
        out["lse"] = lse
    if "predicted" in names:
        out["predicted"] = argmax
    if "entropy" in names:
        out["entropy"] = entropy
    if "target_logprob" in names:
        out["target_logprob"] = logprob
    if "token_accuracy" in names:
        hits = (valid & (argmax == target)).sum()
        out["token_accuracy"] = hits.to(torch.float32) / count.to(torch.float32)
    if "mean_entropy" in names:
        out["mean_entropy"] = torch.where(valid, entropy, 0.0).sum() / count.to(torch.float32)
    if "z_loss" in names:
        w_t = 1.0 if weight is None else weight.float()[torch.where(valid, target, 0)]
        per_row = torch.where(valid, options.z_loss * lse.square() * w_t, 0.0)
        if options.reduction == "none":
            out["z_loss"] = per_row
        elif options.reduction == "sum":
            out["z_loss"] = per_row.sum()
        else:
            divisor = (count.to(torch.float32) if weight is None
                       else torch.where(valid, w_t, 0.0).sum())
            out["z_loss"] = per_row.sum() / divisor
    if "num_tokens" in names:
        out["num_tokens"] = count
    return LossOutput(loss, **out)


# The logits of one chunk of rows take at most this many bytes: about what LinearCrossEntropy's
# chunks take at LLaMA 3's vocab (1920 rows x 128256 x bf16 is 470 MiB).
_CHUNK_BYTES = 512 << 20


def rows_per_chunk(rows: int, vocab: int, dtype: torch.dtype, chunk_rows: Optional[int]) -> int:
    if chunk_rows is not None:
        chunk_rows = integer_option("chunk_rows", chunk_rows)
        if chunk_rows < 1:
            raise ValueError(f"kjit: chunk_rows must be >= 1 or None, got {chunk_rows}")
        return min(chunk_rows, rows)
    element = torch.finfo(dtype).bits // 8
    return max(1, min(rows, _CHUNK_BYTES // max(1, vocab * element)))


def mm_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b accumulated and returned in fp32 (one rounding, not the dtype's)."""
    if a.dtype == torch.float32:
        return a @ b
    try:
        return torch.mm(a, b, out_dtype=torch.float32)
    except (TypeError, RuntimeError, NotImplementedError):  # (older torch, or no such kernel)
        return a.float() @ b.float()


def lm_head(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]):
    """A chunk's logits in the inputs' dtype, autocast or not: the backward recomputes exactly
    the logits the forward read (autocast does not reach a backward)."""
    with torch.autocast(hidden.device.type, enabled=False):
        return F.linear(hidden, weight, bias)


def add_chunk_grads(d_logits: torch.Tensor, h: torch.Tensor, d_weight, d_bias, want_w: bool,
                    want_b: bool, whole: bool, in_dtype: bool = False) -> tuple:
    """d_weight and d_bias with one chunk's d_logits.T @ h and d_logits' column sums added
    (None where not wanted): summed in fp32 over the chunks (in_dtype: in the dtype, no fp32
    accumulator), or one GEMM rounded to the dtype once when the chunk is `whole`."""
    if want_w:
        if whole:
            d_weight = d_logits.t() @ h
        elif in_dtype:
            d_weight = d_logits.t() @ h if d_weight is None else d_weight.addmm_(d_logits.t(), h)
        else:
            part = mm_fp32(d_logits.t(), h)
            d_weight = part if d_weight is None else d_weight.add_(part)
    if want_b:
        part = d_logits.sum(0, dtype=torch.float32)
        d_bias = part if d_bias is None else d_bias.add_(part)
    return d_weight, d_bias
