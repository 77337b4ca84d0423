"""kjit's ops for torch tensors, with autograd: cross_entropy, linear_cross_entropy and rms_norm.

    loss = kjit.torch.cross_entropy(logits, target)           # like F.cross_entropy, fp32 loss
    loss = kjit.torch.linear_cross_entropy(h, lm_head.weight, target)   # no logits in memory
    out = kjit.torch.cross_entropy(logits, target, extras=True)   # a LossOutput: loss, lse,
    out.token_accuracy, out.mean_entropy, out.target_logprob      # predicted tokens, entropy...
    y = kjit.torch.rms_norm(x, weight, eps=1e-6)              # like Hugging Face's LlamaRMSNorm
    y, h = kjit.torch.rms_norm(x, weight, residual=r)         # h = x + r, y = norm(h)

All run on CUDA tensors on the current stream, work under torch.compile(fullgraph=True) and inside
CUDA graphs (build the kernels first: run one step before capturing), and never copy their inputs.
"""

from __future__ import annotations

import warnings
from typing import Iterable, Optional, Union

import torch

from kjit.torch import _kernels
from kjit.torch._common import LossOutput  # noqa: F401 -- what the losses return (re-exported)
from kjit.torch._common import (check_bias_and_dtypes, check_on_one_gpu, checked_class_weight,
                                extras_wanted, fp32_rows, kernel_extras, loss_options,
                                loss_output, refuse_dtensors)

_CASTINGS = ("llama", "gemma", "none")


def _scale_tensor(scale, shape, device) -> Optional[torch.Tensor]:
    """grad_scale as the fp32 device tensor the kernel reads: [1] or [rows]."""
    if scale is None:
        return None
    if not isinstance(scale, torch.Tensor):
        return torch.full(shape, float(scale), dtype=torch.float32, device=device)
    if scale.device != device:
        raise ValueError(f"kjit: grad_scale is on {scale.device} but the input is on {device}")
    return fp32_rows(scale, shape)


class _CrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, weight, grad_scale, options, inplace, grad_enabled, extras):
        # (forward runs with grad mode off: whether the caller had it on comes in grad_enabled)
        needs_grad = grad_enabled and ctx.needs_input_grad[0]
        if not needs_grad:
            results = _kernels.cross_entropy_forward(logits, target, weight, *extras, *options)
        elif inplace and not torch.compiler.is_compiling():
            # The gradient overwrites the logits: nothing else is allocated. The version bump makes
            # autograd refuse (rather than silently misuse) logits that another op saved.
            results = _kernels.cross_entropy_forward_backward_(logits, target, weight, grad_scale,
                                                               *extras, *options)
            torch.autograd.graph.increment_version(logits)
            grad = logits
        else:
            *results, grad = _kernels.cross_entropy_forward_backward(
                logits, target, weight, grad_scale, *extras, *options)
        ctx.mark_non_differentiable(*results[1:])
        if needs_grad:
            # The weight only picks the backward's op handle: the rescale reads no weights.
            ctx.save_for_backward(grad, target, weight, grad_scale)
        ctx.options, ctx.extras = options, extras
        return tuple(results)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *unused):
        if getattr(ctx, "ran", False):  # (torch.compile's traced backward runs once anyway)
            raise RuntimeError("kjit.torch.cross_entropy: backward ran twice on one forward "
                               "(retain_graph=True?): the fused op computes the gradient in the "
                               "forward and hands it out once; call cross_entropy again instead")
        if not torch.compiler.is_compiling():
            ctx.ran = True
        grad, target, weight, grad_scale = ctx.saved_tensors
        shape = (grad.shape[0],) if ctx.options.reduction == "none" else (1,)
        _kernels.cross_entropy_rescale_(grad, target, weight, fp32_rows(grad_loss, shape),
                                        grad_scale, *ctx.extras, *ctx.options)
        return grad, None, None, None, None, None, None, None  # no gradient for the weights


def cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                  weight: Optional[torch.Tensor] = None, *, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                  softcap: Optional[float] = None, return_lse: bool = False,
                  grad_scale: Union[None, float, torch.Tensor] = None,
                  inplace_backward: bool = True,
                  extras: Union[bool, str, Iterable[str]] = False):
    """torch.nn.functional.cross_entropy for logits [rows, vocab] and class targets [rows], fused:
    loss and gradient come from one pass over the logits, computed in fp32 whatever their dtype.

    - reduction "mean" averages over the rows whose target is not ignore_index (NaN when there
      are none, as torch gives); the loss is fp32 (0-d, or [rows] for "none").
    - weight: per-class weights, a 1-D tensor of vocab elements on the logits' device, float32
      or the logits' dtype (F.cross_entropy's `weight`, label smoothing included): a row's loss
      is scaled by its target's weight and "mean" divides by the sum of the valid rows' target
      weights. Used as given, as torch does and without a host synchronization: negative
      weights count as negative, a zero sum makes the mean NaN, a NaN weight makes NaN the
      rows it enters (include/kjit/cross_entropy.h). The weights get no gradient (torch's
      CrossEntropyLoss keeps them as a buffer).
    - z_loss adds z_loss * lse^2 per row; softcap (Gemma 2's final_logit_softcapping) applies
      softcap * tanh(x / softcap) to the logits first (None or 0: off).
    - return_lse: also return the per-row log-sum-exp (fp32 [rows], not differentiable).
    - extras: True, or the names of LossOutput's fields wanted ("predicted", "entropy",
      "target_logprob", "token_accuracy", "mean_entropy", "lse", "z_loss", "num_tokens"): returns
      a LossOutput instead of the loss, from the same pass over the logits (the predicted token
      and the entropy are compiled into the kernel: another program). Not with return_lse.
    - inplace_backward (default): when the logits are an intermediate (the output of lm_head, not
      a leaf tensor) and need a gradient, it is written over them during the forward, so no
      [rows, vocab] buffer is allocated; their values are gone after this call, and autograd
      raises if another op saved them. False allocates the gradient instead (as happens for leaf
      logits and under torch.compile).
    - grad_scale: the upstream gradient you expect the loss to receive (1/num_items when you
      divide a summed loss, a loss scale); the gradient is computed with it. The backward reads
      the actual upstream gradient on the device and rescales only rows where it differs, so
      the usual case costs no pass over the gradient.
    - The backward runs once per forward (the gradient is handed out, not kept): no
      retain_graph=True double backward, no torch.autograd.gradcheck.
    - A target outside [0, vocab) other than ignore_index is treated as ignored (torch raises a
      device-side assert instead; checking here would cost a host synchronization).
    """
    for what, t in (("logits", logits), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    refuse_dtensors("cross_entropy", ("logits", logits), ("target", target), ("weight", weight))
    if logits.dim() != 2:
        raise ValueError(f"kjit: logits must be [rows, vocab], got shape {tuple(logits.shape)}; "
                         "flatten the leading dimensions (logits.view(-1, vocab))")
    if target.dim() != 1 or target.shape[0] != logits.shape[0]:
        raise ValueError(f"kjit: target must be [rows] = [{logits.shape[0]}] class indices, got "
                         f"shape {tuple(target.shape)}")
    if target.is_floating_point():
        raise TypeError("kjit: target must hold class indices (int64 or int32); class "
                        "probabilities are not supported")
    options = loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    names = extras_wanted(extras)
    _kernels.dtype_name(logits, "logits")
    _kernels.index_name(target, "target")
    _kernels.matrix_shape(logits, "logits")
    if weight is not None:
        weight = checked_class_weight(weight, logits, logits.shape[-1])
    check_on_one_gpu(("logits", logits), ("target", target))
    target = target if target.is_contiguous() else target.contiguous()
    shape = (logits.shape[0],) if reduction == "none" else (1,)
    scale = _scale_tensor(grad_scale, shape, logits.device)
    # Only an intermediate's storage is reused: a leaf's values belong to the caller.
    inplace = inplace_backward and not logits.is_leaf
    if names and return_lse:
        raise ValueError("kjit: return_lse and extras: ask for extras=(..., 'lse') instead")
    wanted = kernel_extras(names)
    loss, lse, *per_row = _CrossEntropy.apply(logits, target, weight, scale, options, inplace,
                                              torch.is_grad_enabled(), wanted)
    if names:
        return loss_output(names, loss, target, lse, *per_row, vocab=logits.shape[1],
                           options=options, weight=weight)
    return (loss, lse) if return_lse else loss


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, target, bias, class_weight, grad_scale, options, accumulation,
                grad_enabled, extras):
        # (forward runs with grad mode off: whether the caller had it on comes in grad_enabled)
        want = (grad_enabled and ctx.needs_input_grad[0], grad_enabled and ctx.needs_input_grad[1],
                grad_enabled and bias is not None and ctx.needs_input_grad[3])
        ctx.want, ctx.options, ctx.accumulation = want, options, accumulation
        ctx.class_weight = class_weight
        # The forward's op handle, which the backward's rescale takes its kernels from.
        ctx.op_spec = (weight.shape[0], weight.shape[1], bias is not None,
                       _kernels.index_name(target, "target"), want[1] or want[2],
                       None if class_weight is None else
                       _kernels.dtype_name(class_weight, "class_weight"), extras[0], extras[1])
        if not any(want) or options.reduction == "none":
            # With "none", each row's loss gets its own upstream gradient and d_weight sums over
            # the rows, so a gradient computed now could not be rescaled: the backward runs the
            # fused pass with the upstream gradient instead (the logits GEMM runs twice).
            results = _kernels.linear_cross_entropy_forward(hidden, weight, target, bias,
                                                            class_weight, *extras, *options,
                                                            accumulation)
            if any(want):
                ctx.save_for_backward(hidden, weight, target, bias)
        else:
            # The gradients for upstream gradient grad_scale (1 when None), computed now (as
            # Liger-Kernel's fused linear cross-entropy does): the backward rescales them to the
            # upstream gradient it gets, on the device, touching nothing when the two are equal.
            *results, d_hidden, d_weight, d_bias = _kernels.linear_cross_entropy_forward_backward(
                hidden, weight, target, bias, class_weight, grad_scale, *extras, *want, *options,
                accumulation)
            ctx.save_for_backward(d_hidden, d_weight, d_bias, grad_scale)
        ctx.mark_non_differentiable(*results[1:])
        return tuple(results)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_loss, *unused):
        if getattr(ctx, "ran", False):  # (torch.compile's traced backward runs once anyway)
            raise RuntimeError("kjit.torch.linear_cross_entropy: backward ran twice on one forward "
                               "(retain_graph=True?): the fused op computes the gradients in the "
                               "forward and hands them out once; call linear_cross_entropy again "
                               "instead")
        if not torch.compiler.is_compiling():
            ctx.ran = True
        if ctx.options.reduction == "none":
            hidden, weight, target, bias = ctx.saved_tensors
            grads = _kernels.linear_cross_entropy_forward_backward(
                hidden, weight, target, bias, ctx.class_weight,
                fp32_rows(grad_loss, (hidden.shape[0],)), False, False, False, *ctx.want,
                *ctx.options, ctx.accumulation)[-3:]
        else:
            *saved, applied = ctx.saved_tensors
            grad_output = fp32_rows(grad_loss, (1,))
            if torch.compiler.is_compiling():
                # Out of place: torch.compile functionalizes the graph anyway.
                scale = grad_output if applied is None else grad_output / applied
                grads = [g * scale if wanted else None for g, wanted in zip(saved, ctx.want)]
            else:
                # In place (the saved gradients are handed out once), and only where the upstream
                # gradient differs from the one they were computed for.
                for which, g, wanted in zip(("d_hidden", "d_weight", "d_bias"), saved, ctx.want):
                    if wanted:
                        _kernels.linear_cross_entropy_rescale_(g, which, grad_output, applied,
                                                               *ctx.op_spec, *ctx.options,
                                                               ctx.accumulation)
                grads = saved
        d_hidden, d_weight, d_bias = (g if wanted else None for g, wanted in zip(grads, ctx.want))
        return d_hidden, d_weight, None, d_bias, None, None, None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                         bias: Optional[torch.Tensor] = None, *, ignore_index: int = -100,
                         reduction: str = "mean", label_smoothing: float = 0.0,
                         z_loss: float = 0.0, softcap: Optional[float] = None,
                         class_weight: Optional[torch.Tensor] = None,
                         grad_scale: Union[None, float, torch.Tensor] = None,
                         weight_grad_accumulation: str = "fp32",
                         extras: Union[bool, str, Iterable[str]] = False,
                         lse_square_scale: Optional[float] = None):
    """F.cross_entropy(hidden @ weight.T + bias, target, ...) fused: the lm_head GEMM and the loss
    run over chunks of rows (cuBLASLt GEMMs, kjit's cross-entropy), so the [rows, vocab] logits
    never exist in memory (include/kjit/linear_cross_entropy.h).

    - hidden [rows, hidden_size] (flatten the leading dimensions), weight [vocab, hidden_size]
      (lm_head's), bias [vocab] or None, all in one dtype (float32, float16 or bfloat16) on one
      GPU; target [rows] class indices (int64 or int32). The loss is fp32: 0-d, or [rows] for
      reduction "none". The logits are computed in the dtype (rounded as lm_head's output
      would be), the loss from them in fp32.
    - ignore_index, reduction and label_smoothing as F.cross_entropy's ("mean" over the rows
      whose target is not ignore_index: NaN when there are none); z_loss adds z_loss * lse^2 per
      row (cross_entropy's name; lse_square_scale, the old one, still works and warns); softcap
      > 0 applies softcap * tanh(x / softcap) to the logits first (Gemma 2; None or 0: off, as
      in cross_entropy). A target outside [0, vocab) is treated as ignored.
    - class_weight: cross_entropy's `weight` (F.cross_entropy's; Liger-Kernel's ce_weight), a
      [vocab] tensor in float32 or hidden's dtype: named apart because `weight` is lm_head's.
    - weight_grad_accumulation: "fp32" (default) sums d_weight and d_bias over the chunks in an
      fp32 accumulator (vocab x hidden_size x 4 bytes of workspace); "output_dtype" adds each
      chunk's product straight into them in the weight's dtype: no accumulator, less precise.
    - extras: as cross_entropy's (a LossOutput instead of the loss), from the same pass.
    - Autograd: only the inputs that require grad get gradients (none: the forward alone runs).
      For "mean" and "sum" the gradients are computed in the forward pass, as Liger-Kernel's
      fused linear cross-entropy does, for the upstream gradient grad_scale (1 when None; a
      float or a fp32 tensor of one element, read on the device, such as Hugging Face's
      1 / num_items_in_batch), and the backward rescales them to the upstream gradient it gets:
      on the device, and not at all (one small launch per gradient) when the two are equal.
      d_hidden is in hidden's dtype, d_weight and d_bias summed over the chunks in fp32 (a
      vocab x hidden_size x 4-byte workspace while the op runs) and rounded to the weight's dtype
      once. For "none" the backward runs the fused pass with the per-row upstream gradient.
    - The backward runs once per forward (no retain_graph=True double backward).
    """
    for what, t in (("hidden", hidden), ("weight", weight), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"kjit: bias must be a torch.Tensor or None, got {type(bias).__name__}")
    refuse_dtensors("linear_cross_entropy", ("weight", weight), ("hidden", hidden),
                    ("target", target), ("bias", bias), ("class_weight", class_weight))
    if hidden.dim() != 2:
        raise ValueError(f"kjit: hidden must be [rows, hidden_size], got shape "
                         f"{tuple(hidden.shape)}; flatten the leading dimensions "
                         "(hidden.view(-1, hidden_size))")
    rows, size = hidden.shape
    if rows == 0:
        raise ValueError("kjit: hidden has no rows; the op needs at least one")
    if weight.dim() != 2 or weight.shape[1] != size:
        raise ValueError(f"kjit: weight must be [vocab, hidden_size] = [vocab, {size}], got shape "
                         f"{tuple(weight.shape)}")
    vocab = weight.shape[0]
    if target.dim() != 1 or target.shape[0] != rows:
        raise ValueError(f"kjit: target must be [rows] = [{rows}] class indices, got shape "
                         f"{tuple(target.shape)}")
    if target.is_floating_point():
        raise TypeError("kjit: target must hold class indices (int64 or int32); class "
                        "probabilities are not supported")
    check_bias_and_dtypes(hidden, weight, bias)
    _kernels.index_name(target, "target")
    if lse_square_scale is not None:
        warnings.warn("kjit: linear_cross_entropy's lse_square_scale is now z_loss (as in "
                      "cross_entropy); the old name will go", DeprecationWarning, stacklevel=2)
        if z_loss:
            raise ValueError("kjit: give z_loss alone (lse_square_scale is its old name)")
        z_loss = lse_square_scale
    options = loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap)
    names = extras_wanted(extras)
    if weight_grad_accumulation not in ("fp32", "output_dtype"):
        raise ValueError("kjit: weight_grad_accumulation must be 'fp32' or 'output_dtype', got "
                         f"{weight_grad_accumulation!r}")
    _kernels.matrix_shape(hidden, "hidden")
    _kernels.matrix_shape(weight, "weight")
    check_on_one_gpu(("hidden", hidden), ("weight", weight), ("target", target),
                     *((("bias", bias),) if bias is not None else ()))
    target = target if target.is_contiguous() else target.contiguous()
    if bias is not None and not bias.is_contiguous():
        bias = bias.contiguous()  # (differentiable: its gradient reaches the strided bias)
    if grad_scale is not None and reduction == "none":
        raise ValueError("kjit: grad_scale is for reduction 'sum' and 'mean'; with 'none' each "
                         "row's upstream gradient reaches the backward as it is")
    scale = _scale_tensor(grad_scale, (1,), hidden.device)
    if class_weight is not None:
        class_weight = checked_class_weight(class_weight, hidden, vocab, "class_weight")
    wanted = kernel_extras(names)
    if names & {"lse", "z_loss"} and not any(wanted):
        wanted = (False, False, True)  # any per-row output makes the op compute the lse
    loss, lse, *per_row = _LinearCrossEntropy.apply(hidden, weight, target, bias, class_weight,
                                                    scale, options, weight_grad_accumulation,
                                                    torch.is_grad_enabled(), wanted)
    if names:
        return loss_output(names, loss, target, lse, *per_row, vocab=vocab, options=options,
                           weight=class_weight)
    return loss


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, residual, eps, offset, casting):
        y, rstd, h = _kernels.rms_norm_forward(x, weight, residual, eps, offset, casting)
        fused = residual is not None
        ctx.save_for_backward(h if fused else x, weight, rstd)
        ctx.options = (eps, offset, casting)
        ctx.fused = fused
        if not fused:
            ctx.mark_non_differentiable(h)
        return y, h

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy, dh):
        normalized, weight, rstd = ctx.saved_tensors
        dy = _contiguous_rows(dy)
        dh = _contiguous_rows(dh) if ctx.fused and dh is not None else None
        dx, dw = _kernels.rms_norm_backward(dy, normalized, weight, rstd, dh, *ctx.options,
                                            ctx.fused)
        return dx, dw, (dx if ctx.fused else None), None, None, None


def _contiguous_rows(t: torch.Tensor) -> torch.Tensor:
    """t when the kernels can see it as [rows, t.shape[-1]] rows of one stride, else a contiguous
    copy (differentiable)."""
    return t if _kernels.is_matrix(t) else t.contiguous()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, *,
             casting: str = "llama", offset: float = 0.0,
             residual: Optional[torch.Tensor] = None):
    """RMSNorm over the last dimension: y = x * rsqrt(mean(x^2) + eps) * (offset + weight).

    casting "llama" rounds the normalized x to x's dtype before the weight multiply (Hugging
    Face's LlamaRMSNorm, Qwen2, Mistral); "gemma" stays in fp32 until the store (Gemma2RMSNorm,
    with offset=1.0); "none" computes in x's dtype, rounding every intermediate where
    `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight)` does in eager
    PyTorch (x^2, the mean (accumulated in fp32), + eps, rsqrt, x * rstd, offset + weight and
    the product), and needs weight in x's dtype. Its backward, as the others', is fp32 with the
    saved rstd. y has x's dtype. With `residual`, h = x + residual is normalized and (y, h)
    returned: the add of a pre-norm block fused into the norm. x and residual may have any
    strides: a view whose rows have no single stride is copied first (y and h are contiguous).
    """
    for what, t in (("x", x), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    refuse_dtensors("rms_norm", ("x", x), ("weight", weight), ("residual", residual))
    if casting not in _CASTINGS:
        raise ValueError(f"kjit: casting must be one of {_CASTINGS}, got {casting!r}")
    if weight.dim() != 1 or weight.shape[0] != x.shape[-1]:
        raise ValueError(f"kjit: weight must be [hidden] = [{x.shape[-1]}], got shape "
                         f"{tuple(weight.shape)}")
    if not weight.is_contiguous():
        raise ValueError("kjit: weight must be contiguous")
    if casting == "none" and weight.dtype != x.dtype:
        raise ValueError(f"kjit: casting 'none' computes in x's dtype and needs weight in it "
                         f"({x.dtype}), got {weight.dtype}")
    _kernels.dtype_name(x, "x")
    _kernels.dtype_name(weight, "weight")
    # Any strided x (as F.rms_norm): the kernels take rows of one stride, so a view that cannot
    # be seen so (Gemma 3's q/k norm gets a transposed [b, heads, seq, head_dim] view) is copied,
    # differentiably: its gradient comes back in the view's shape and strides.
    x = _contiguous_rows(x)
    check_on_one_gpu(("x", x), ("weight", weight),
                     *((("residual", residual),) if residual is not None else ()))
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValueError(f"kjit: residual must match x ({tuple(x.shape)}, {x.dtype}), got "
                             f"{tuple(residual.shape)}, {residual.dtype}")
        residual = _contiguous_rows(residual)
    y, h = _RmsNorm.apply(x, weight, residual, float(eps), float(offset), casting)
    return (y, h) if residual is not None else y
