"""Reinforcement-learning heads: each token's log-probability under the policy and the entropy of
the policy's distribution there, with temperature, from the logits or straight from the hidden
states and lm_head's weight, differentiable through both outputs (issue 47).

    logprob = kjit.torch.log_probs(logits, target, temperature=0.7)            # [batch, seq]
    logprob, entropy = kjit.torch.log_probs(logits, target, entropy=True)
    logprob, entropy = kjit.torch.linear_log_probs(hidden, lm_head.weight, target,
                                                   temperature=0.7, entropy=True)

Per row with logits z, target t and temperature T (p = softmax(z / T)):
    logprob = log p_t = z_t / T - lse(z / T),      entropy = -sum_j p_j log p_j,
both fp32, 0 where the target is ignore_index (or outside the vocab). The gradients, for upstream
gradients g_lp and g_H of the two outputs (either may be absent: its term is left out), are
    d z_j = (g_lp (1[j = t] - p_j) - g_H p_j (log p_j + H)) / T,
zero on ignored rows. The kernels apply 1 / T as they read each logit: no scaled copy of the
logits (or, from the hidden states, of the weight) is made. A forward without gradients (an old or
reference policy under torch.no_grad()) writes the per-row outputs and nothing else.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from kjit import _capi
from kjit.torch import _kernels
from kjit.torch._common import (add_chunk_grads, check_bias_and_dtypes, check_on_one_gpu,
                                integer_option, lm_head, number_option, refuse_dtensors,
                                rows_per_chunk)


def _check_temperature(temperature) -> float:
    """A number (TypeError naming the type expected otherwise, a str such as "0.7" included),
    finite and > 0."""
    value = number_option("temperature", temperature)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"kjit: temperature must be a finite number > 0, got "
                         f"{_capi.quoted(temperature)}")
    return value


def _check_target(target: torch.Tensor, leading: tuple, what: str) -> None:
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"kjit: target must be a torch.Tensor, got {type(target).__name__}")
    if target.is_floating_point():
        raise TypeError("kjit: target must hold class indices (int64 or int32)")
    _kernels.index_name(target, "target")
    if tuple(target.shape) != tuple(leading):
        raise ValueError(f"kjit: target must have {what}'s leading shape {tuple(leading)}, got "
                         f"{tuple(target.shape)}")


def _upstream(g: Optional[torch.Tensor], rows: int) -> Optional[torch.Tensor]:
    """A per-row upstream gradient as the contiguous fp32 [rows] the kernels read."""
    if g is None:
        return None
    g = g.detach().reshape(-1)
    if g.dtype != torch.float32 or not g.is_contiguous() or g.shape[0] != rows:
        g = g.to(torch.float32).expand(rows).contiguous()
    return g


def _keep_for_backward(ctx, keep: bool, saved: tuple, options: tuple, entropy: torch.Tensor,
                       want_entropy: bool) -> None:
    """What a forward leaves its backward: the tensors (when a gradient is wanted), the options
    and the number of rows; an entropy not asked for (empty) has no gradient."""
    if keep:
        ctx.save_for_backward(*saved)
    ctx.options = options
    ctx.rows = saved[-2].shape[0]  # (the lse, [rows], comes before the entropy)
    if not want_entropy:
        ctx.mark_non_differentiable(entropy)


def _backward(ctx, name: str, gradients, inputs: int, grad_logprob, grad_entropy) -> tuple:
    """An RL head's backward: gradients(ctx, upstreams) for its first `inputs` inputs, None for
    the rest (six options); nothing runs when neither output has an upstream gradient. It runs
    once per forward."""
    if grad_logprob is None and grad_entropy is None:
        return (None,) * (inputs + 6)
    if getattr(ctx, "ran", False):  # (torch.compile's traced backward runs once anyway)
        raise RuntimeError(f"kjit.torch.{name}: backward ran twice on one forward "
                           f"(retain_graph=True?); call {name} again instead")
    if not torch.compiler.is_compiling():
        ctx.ran = True
    up = (_upstream(grad_logprob, ctx.rows), _upstream(grad_entropy, ctx.rows))
    return (*gradients(ctx, up), *(None,) * 6)


class _LogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, target, temperature, ignore_index, want_entropy, inplace,
                grad_enabled):
        ctx.set_materialize_grads(False)
        logprob, entropy, lse = _kernels.log_probs_forward(logits, target, temperature,
                                                           ignore_index, want_entropy)
        _keep_for_backward(ctx, grad_enabled and ctx.needs_input_grad[0],
                           (logits, target, lse, entropy), (temperature, ignore_index), entropy,
                           want_entropy)
        ctx.inplace = inplace
        return logprob, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprob, grad_entropy):
        return _backward(ctx, "log_probs", _logits_gradient, 1, grad_logprob, grad_entropy)


def _logits_gradient(ctx, up) -> tuple:
    logits, target, lse, entropy = ctx.saved_tensors
    if ctx.inplace and not torch.compiler.is_compiling():
        # The forward's logits are read once more and overwritten by their gradient.
        _kernels.log_probs_backward_(logits, target, lse, entropy, *up, *ctx.options)
        return (logits,)
    return (_kernels.log_probs_backward(logits, target, lse, entropy, *up, *ctx.options),)


def _outputs(logprob, entropy, shape, want_entropy):
    logprob = logprob.view(shape)
    return (logprob, entropy.view(shape)) if want_entropy else logprob


def log_probs(logits: torch.Tensor, target: torch.Tensor, temperature: float = 1.0,
              entropy: bool = False, *, ignore_index: int = -100,
              inplace_backward: bool = False):
    """Each token's log-probability log softmax(logits / temperature)[target] (fp32, target's
    shape), and with entropy=True also the entropy of softmax(logits / temperature), as a
    (logprob, entropy) pair: TRL's and verl's per-token log-probs and entropies, with gradients
    through both.

    - logits [..., vocab] (float32, float16 or bfloat16, on a CUDA GPU), target [...] class
      indices (int64 or int32) with the logits' leading shape (TRL's logits[:, :-1] and
      completion ids: the leading dimensions are flattened, copying only a view that cannot be
      seen as rows of one stride).
    - temperature > 0 divides the logits inside the kernel (TRL's and verl's `temperature`).
    - Rows whose target is ignore_index (or outside the vocab) give 0 for both outputs and a zero
      gradient.
    - Autograd: the backward takes the upstream gradients of both outputs at once (either may be
      absent) and reads the logits once more: the forward keeps nothing but the logits and two
      floats a row. inplace_backward=True writes the gradient over the logits (no [rows, vocab]
      buffer; only when nothing else reads those logits afterwards). The backward runs once per
      forward.
    """
    for what, t in (("logits", logits), ("target", target)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    refuse_dtensors("log_probs", ("logits", logits), ("target", target))
    if logits.dim() < 1:
        raise ValueError("kjit: logits must be [..., vocab]")
    _kernels.dtype_name(logits, "logits")
    _check_target(target, logits.shape[:-1], "logits")
    temperature = _check_temperature(temperature)
    ignore_index = integer_option("ignore_index", ignore_index)
    vocab = logits.shape[-1]
    if vocab < 1:
        raise ValueError("kjit: logits have an empty vocab dimension")
    check_on_one_gpu(("logits", logits), ("target", target))
    shape = target.shape
    if target.numel() == 0:
        empty = logits.float().sum(-1) * 0.0  # (differentiable, and nothing to launch)
        return (empty, empty.detach().clone()) if entropy else empty
    rows2d = logits.reshape(-1, vocab)
    try:
        _kernels.matrix_shape(rows2d, "logits")
    except ValueError:
        rows2d = rows2d.contiguous()
    flat_target = target.reshape(-1)
    flat_target = flat_target if flat_target.is_contiguous() else flat_target.contiguous()
    logprob, ent = _LogProbs.apply(rows2d, flat_target, temperature, ignore_index,
                                   bool(entropy), bool(inplace_backward), torch.is_grad_enabled())
    return _outputs(logprob, ent, shape, entropy)


class _LinearLogProbs(torch.autograd.Function):
    """The lm_head and the RL head over chunks of rows: each chunk's logits exist only while it
    is processed, in the forward and again (recomputed) in the backward, whose upstream gradients
    are known only then."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, temperature, ignore_index, want_entropy, chunk,
                grad_enabled):
        ctx.set_materialize_grads(False)
        rows = hidden.shape[0]
        outs = ([], [], [])
        for start in range(0, rows, chunk):
            logits = lm_head(hidden[start:start + chunk], weight, bias)
            for out, value in zip(outs, _kernels.log_probs_forward(
                    logits, target[start:start + chunk], temperature, ignore_index,
                    want_entropy)):
                out.append(value)
            del logits
        logprob, entropy, lse = (o[0] if len(o) == 1 else torch.cat(o) for o in outs)
        _keep_for_backward(ctx, grad_enabled and any(ctx.needs_input_grad[:3]),
                           (hidden, weight, bias, target, lse, entropy),
                           (temperature, ignore_index), entropy, want_entropy)
        ctx.chunk = chunk
        return logprob, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logprob, grad_entropy):
        return _backward(ctx, "linear_log_probs", _lm_head_gradients, 3, grad_logprob,
                         grad_entropy)


def _lm_head_gradients(ctx, up) -> tuple:
    """d_hidden, d_weight and d_bias (None where not wanted), chunk by chunk: the logits again,
    the RL head's gradient over them, then its products with the weight and the hidden states."""
    hidden, weight, bias, target, lse, entropy = ctx.saved_tensors
    want_h, want_w, want_b = ctx.needs_input_grad[:3]
    want_b = want_b and bias is not None
    rows, chunk = hidden.shape[0], ctx.chunk
    whole = chunk >= rows
    d_hidden, d_weight, d_bias = [], None, None
    for start in range(0, rows, chunk):
        end = min(rows, start + chunk)
        h = hidden[start:end]
        d_logits = lm_head(h, weight, bias)
        _kernels.log_probs_backward_(
            d_logits, target[start:end], lse[start:end],
            entropy[start:end] if entropy.numel() else entropy,
            *(None if g is None else g[start:end] for g in up), *ctx.options)
        if want_h:
            d_hidden.append(d_logits @ weight)
        d_weight, d_bias = add_chunk_grads(d_logits, h, d_weight, d_bias, want_w, want_b, whole)
        del d_logits
    d_hidden = (d_hidden[0] if len(d_hidden) == 1 else torch.cat(d_hidden)) if want_h else None
    d_weight = d_weight.to(weight.dtype) if want_w else None
    d_bias = d_bias.to(bias.dtype) if want_b else None
    return d_hidden, d_weight, d_bias


def linear_log_probs(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                     bias: Optional[torch.Tensor] = None, temperature: float = 1.0,
                     entropy: bool = False, *, ignore_index: int = -100,
                     chunk_rows: Optional[int] = None):
    """log_probs(hidden @ weight.T + bias, target, temperature, entropy) without the [tokens,
    vocab] logits in memory: the rows go through lm_head and the RL head in chunks (chunk_rows,
    default: a chunk's logits take at most 512 MiB), forward and, recomputed, backward.

    - hidden [..., hidden_size], weight [vocab, hidden_size] (lm_head's), bias [vocab] or None,
      one dtype (float32, float16 or bfloat16) on one GPU; target [...] with hidden's leading
      shape. Outputs fp32 in target's shape: logprob, or (logprob, entropy) with entropy=True.
    - Gradients for the inputs that require them, from the upstream gradients of both outputs
      (either may be absent): d_hidden in hidden's dtype, d_weight and d_bias summed over the
      chunks in fp32 and rounded to the weight's dtype once. The backward recomputes each chunk's
      logits (the upstream gradients of RL losses are known only then): 4 GEMMs a step where a
      loss whose upstream gradient is known takes 3.
    - lm_head runs in the inputs' dtype even under autocast (so that the backward recomputes the
      logits the forward read): cast hidden and weight to autocast's dtype first for a bf16 GEMM
      (kjit.torch.integrations.trl does).
    """
    for what, t in (("hidden", hidden), ("weight", weight)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"kjit: {what} must be a torch.Tensor, got {type(t).__name__}")
    if bias is not None and not isinstance(bias, torch.Tensor):
        raise TypeError(f"kjit: bias must be a torch.Tensor or None, got {type(bias).__name__}")
    refuse_dtensors("linear_log_probs", ("weight", weight), ("hidden", hidden),
                    ("target", target), ("bias", bias))
    if hidden.dim() < 1 or weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"kjit: weight must be [vocab, hidden_size] = [vocab, "
                         f"{hidden.shape[-1] if hidden.dim() else '?'}], got shape "
                         f"{tuple(weight.shape)} for hidden {tuple(hidden.shape)}")
    vocab, size = weight.shape
    _check_target(target, hidden.shape[:-1], "hidden")
    check_bias_and_dtypes(hidden, weight, bias)
    temperature = _check_temperature(temperature)
    ignore_index = integer_option("ignore_index", ignore_index)
    check_on_one_gpu(("hidden", hidden), ("weight", weight), ("target", target),
                     *((("bias", bias),) if bias is not None else ()))
    shape = target.shape
    if target.numel() == 0:
        empty = (hidden.float().sum(-1) + weight.float().sum() * 0.0) * 0.0
        return (empty, empty.detach().clone()) if entropy else empty
    rows = target.numel()
    flat_hidden = hidden.reshape(rows, size)
    flat_target = target.reshape(-1)
    flat_target = flat_target if flat_target.is_contiguous() else flat_target.contiguous()
    chunk = rows_per_chunk(rows, vocab, hidden.dtype, chunk_rows)
    logprob, ent = _LinearLogProbs.apply(flat_hidden, weight, bias, flat_target, temperature,
                                         ignore_index, bool(entropy), chunk,
                                         torch.is_grad_enabled())
    return _outputs(logprob, ent, shape, entropy)
