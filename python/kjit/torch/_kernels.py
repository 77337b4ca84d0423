"""kjit's kernels as torch.library custom ops ("kjit::..."), with fake (meta) implementations.

These are the opaque units torch.compile traces: each launches on the current stream, allocates
only through torch (outputs and workspaces), and never synchronizes with the host, so CUDA graphs
capture them. Eager mode calls the same functions without the dispatcher (_Kernel). Autograd lives
one level up (kjit/torch/functional.py). Op handles are built once per device and spec and kept;
creating one builds its default kernels, and a warm-up step before a CUDA-graph capture builds the
rest.
"""

from __future__ import annotations

import threading
from typing import Callable, Optional

import torch

from kjit import _capi
from kjit._loss_options import SCHEMA as LOSS_SCHEMA
from kjit._loss_options import LossOptions
from kjit._runtime import CrossEntropy, LinearCrossEntropy, LogProbs, RmsNorm, Runtime

_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_INDEX_TYPES = {torch.int32: "int32", torch.int64: "int64"}

_lock = threading.Lock()
_runtimes: dict = {}
_ops: dict = {}


def runtime(device: torch.device) -> Runtime:
    """The kjit Runtime of a CUDA device (one per device and process)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _lock:
        rt = _runtimes.get(index)
        if rt is None:
            rt = _runtimes[index] = Runtime(index)
        return rt


def cached_op(device: torch.device, key: tuple, make: Callable[[Runtime], object]):
    """The op handle of `key` (its kind and spec) on `device`, made once by make(runtime)."""
    key = (device.index, *key)
    op = _ops.get(key)
    if op is None:
        op = make(runtime(device))
        with _lock:
            op = _ops.setdefault(key, op)
    return op


def _stream(device: torch.device) -> int:
    """The current stream's cudaStream_t (torch's raw accessor, as compiled code uses it)."""
    return _raw_stream(device.index if device.index is not None else torch.cuda.current_device())


_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream",
                      lambda index: torch.cuda.current_stream(index).cuda_stream)


def dtype_name(t: torch.Tensor, what: str) -> str:
    name = _DTYPES.get(t.dtype)
    if name is None:
        raise TypeError(f"kjit: {what} must be float32, float16 or bfloat16, got {t.dtype}")
    return name


def index_name(t: torch.Tensor, what: str) -> str:
    name = _INDEX_TYPES.get(t.dtype)
    if name is None:
        raise TypeError(f"kjit: {what} must be int64 or int32, got {t.dtype}")
    return name


def matrix_shape(t: torch.Tensor, what: str) -> tuple:
    """(rows, row_stride) of t seen as [rows, t.shape[-1]]: its leading dimensions must collapse
    into one with a single stride and its last dimension must be contiguous (no copy is made)."""
    found = _rows_of(t, what)
    if isinstance(found, str):
        raise ValueError(found)
    return found


def is_matrix(t: torch.Tensor) -> bool:
    """Whether matrix_shape takes t (without raising: torch.compile traces this)."""
    return not isinstance(_rows_of(t, ""), str)


def _rows_of(t: torch.Tensor, what: str):
    """matrix_shape's (rows, row_stride), or the message of why t cannot be seen so."""
    cols = t.shape[-1]
    if t.dim() == 1:
        return 1, max(cols, 1)
    if t.stride(-1) != 1 and cols > 1:
        return (f"kjit: {what} must have a contiguous last dimension (stride 1), got strides "
                f"{tuple(t.stride())}; call .contiguous() first")
    rows, row_stride = 1, t.stride(-2) if t.shape[-2] > 1 else max(cols, 1)
    expected = row_stride
    for size, stride in zip(reversed(t.shape[:-1]), reversed(t.stride()[:-1])):
        if size != 1 and stride != expected:
            return (f"kjit: {what} of shape {tuple(t.shape)} and strides {tuple(t.stride())} "
                    f"cannot be seen as [rows, {cols}] rows with one stride; call .contiguous() "
                    "first")
        expected = stride * size if size != 1 else expected
        rows *= size
    if row_stride < cols:
        return f"kjit: {what}'s rows overlap (row stride {row_stride} < {cols})"
    return rows, row_stride


def as_matrix(t: Optional[torch.Tensor], what: str) -> _capi.Tensor:
    if t is None:
        return _capi.Tensor()
    rows, row_stride = matrix_shape(t, what)
    return _capi.Tensor(t.data_ptr(), _capi.DTYPES[dtype_name(t, what)], rows, t.shape[-1],
                        row_stride)


def as_vector(t: Optional[torch.Tensor]) -> _capi.Tensor:
    """A contiguous 1-D (or 0-d) tensor as a kjit vector."""
    if t is None:
        return _capi.Tensor()
    n = t.numel()
    return _capi.Tensor(t.data_ptr(), _capi.DTYPES[_DTYPES[t.dtype]], 1, n, n)


def as_index(t: torch.Tensor, what: str) -> _capi.Index:
    return _capi.Index(t.data_ptr(), _capi.INDEX_TYPES[index_name(t, what)], t.numel())


def _workspace(size_of: Callable[[int], int], rows: int, device: torch.device) -> torch.Tensor:
    """A workspace of size_of(rows) bytes, size_of an op's bound method (the size is asked of the
    library once per op, method and row count)."""
    key = (size_of, rows)
    nbytes = _workspace_bytes.get(key)
    if nbytes is None:
        nbytes = _workspace_bytes[key] = size_of(rows)
    return torch.empty(max(nbytes, 16), dtype=torch.uint8, device=device)


_workspace_bytes: dict = {}  # ops live as long as the process (_ops): their methods as keys


class _Kernel:
    """One of kjit's launches as both a torch.library custom op, which torch.compile traces, and
    the plain function behind it, which eager mode calls directly: the same launch without the
    dispatcher's per-call overhead (tens of microseconds, visible at small shapes)."""

    def __init__(self, fn, op):
        self.fn, self.op = fn, op

    def __call__(self, *args):
        return (self.op if torch.compiler.is_compiling() else self.fn)(*args)

    def register_fake(self, fake):
        self.op.register_fake(fake)
        return fake


def _kernel(name: str, schema: str, mutates_args=()):
    def wrap(fn):
        op = torch.library.custom_op(f"kjit::{name}", fn, mutates_args=mutates_args,
                                     device_types="cuda", schema=schema)
        return _Kernel(fn, op)
    return wrap


# ---- Cross-entropy -----------------------------------------------------------------------------

def cross_entropy_op(logits: torch.Tensor, target: torch.Tensor, options: LossOptions,
                     weight: Optional[torch.Tensor] = None, argmax: bool = False,
                     entropy: bool = False) -> CrossEntropy:
    """The op handle; class weights make another program, keyed by their dtype (the weights
    themselves are a launch argument), and so do argmax and entropy (per-row outputs compiled in)."""
    spec = dict(vocab=logits.shape[-1], dtype=dtype_name(logits, "logits"),
                target_type=index_name(target, "target"),
                class_weight_dtype=None if weight is None else dtype_name(weight, "weight"),
                argmax=bool(argmax), entropy=bool(entropy))
    return cached_op(logits.device, ("cross_entropy", options, *spec.values()),
                     lambda rt: rt.cross_entropy(**spec, **options._asdict()))


def _loss_like(logits: torch.Tensor, reduction: str) -> torch.Tensor:
    shape = (logits.shape[0],) if reduction == "none" else ()
    return torch.empty(shape, dtype=torch.float32, device=logits.device)


def _lse_like(logits: torch.Tensor) -> torch.Tensor:
    return torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)


def _extras_like(rows: torch.Tensor, target: torch.Tensor, argmax: bool, entropy: bool,
                 logprob: bool) -> tuple:
    """The per-row extras asked for ([rows]: argmax in the target's dtype, entropy and the
    target's log-probability in fp32), each empty ([0]) when not asked (a custom op returns
    tensors, not None)."""
    n, device = rows.shape[0], rows.device
    return (torch.empty(n if argmax else 0, dtype=target.dtype, device=device),
            torch.empty(n if entropy else 0, dtype=torch.float32, device=device),
            torch.empty(n if logprob else 0, dtype=torch.float32, device=device))


def _extras_fields(extras: tuple, target: torch.Tensor) -> dict:
    argmax, entropy, logprob = extras
    fields = {}
    if argmax.numel():
        fields["argmax"] = as_index(argmax, "argmax")
    if entropy.numel():
        fields["entropy"] = as_vector(entropy)
    if logprob.numel():
        fields["target_logprob"] = as_vector(logprob)
    return fields


def _ce_launch(logits, target, weight, grad, grad_scale, want, options: LossOptions):
    """The forward, or with `grad` (a tensor, or the logits: in place) the forward and backward
    in one pass."""
    op = cross_entropy_op(logits, target, options, weight, want[0], want[1])
    rows = logits.shape[0]
    loss, lse = _loss_like(logits, options.reduction), _lse_like(logits)
    extras = _extras_like(logits, target, *want)
    workspace = _workspace(op.workspace_bytes, rows, logits.device)
    matrix = as_matrix(logits, "logits")
    fields = dict(logits=matrix, targets=as_index(target, "target"), loss=as_vector(loss),
                  lse=as_vector(lse), workspace=workspace.data_ptr(),
                  workspace_bytes=workspace.numel(), **_extras_fields(extras, target))
    if weight is not None:
        fields.update(class_weight=as_vector(weight))
    if grad is None:
        op.forward(_stream(logits.device), **fields)
    else:
        op.forward_backward(_stream(logits.device), grad_output=as_vector(grad_scale),
                            grad=matrix if grad is logits else as_matrix(grad, "grad"), **fields)
    return (loss, lse, *extras)

# Which per-row extras a launch writes: argmax (the predicted token), entropy, the target's
# log-probability.
_SCHEMA_EXTRAS = "bool argmax, bool entropy, bool logprob"
_CE_RESULTS = "(Tensor, Tensor, Tensor, Tensor, Tensor)"  # loss, lse, argmax, entropy, logprob
# The custom ops take the loss options as LOSS_SCHEMA's scalars, last: `*options` below, made one
# LossOptions again (LossOptions(*options)) before anything reads them.


@_kernel("cross_entropy_forward", mutates_args=(),
         schema=f"(Tensor logits, Tensor target, Tensor? weight, {_SCHEMA_EXTRAS}, "
                f"{LOSS_SCHEMA}) -> {_CE_RESULTS}")
def cross_entropy_forward(logits, target, weight, argmax, entropy, logprob, *options):
    """Loss, lse and the extras asked for; no gradient. weight: the class weights ([vocab],
    contiguous) or None."""
    return _ce_launch(logits, target, weight, None, None, (argmax, entropy, logprob),
                      LossOptions(*options))


def _ce_results_like(logits, target, want, options) -> tuple:
    """A launch's loss, lse and extras, as the fake ops return them."""
    return (_loss_like(logits, LossOptions(*options).reduction), _lse_like(logits),
            *_extras_like(logits, target, *want))


@cross_entropy_forward.register_fake
def _(logits, target, weight, argmax, entropy, logprob, *options):
    return _ce_results_like(logits, target, (argmax, entropy, logprob), options)


@_kernel("cross_entropy_forward_backward", mutates_args=(),
         schema=f"(Tensor logits, Tensor target, Tensor? weight, Tensor? grad_scale, "
                f"{_SCHEMA_EXTRAS}, {LOSS_SCHEMA}) "
                "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)")
def cross_entropy_forward_backward(logits, target, weight, grad_scale, argmax, entropy, logprob,
                                   *options):
    """Loss, lse, the extras and the gradient (for upstream gradient grad_scale, 1 when None) in
    a new tensor: one pass over the logits."""
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    results = _ce_launch(logits, target, weight, grad, grad_scale, (argmax, entropy, logprob),
                         LossOptions(*options))
    return (*results, grad)


@cross_entropy_forward_backward.register_fake
def _(logits, target, weight, grad_scale, argmax, entropy, logprob, *options):
    return (*_ce_results_like(logits, target, (argmax, entropy, logprob), options),
            torch.empty_like(logits, memory_format=torch.contiguous_format))


@_kernel("cross_entropy_forward_backward_", mutates_args=("logits",),
         schema=f"(Tensor(a!) logits, Tensor target, Tensor? weight, Tensor? grad_scale, "
                f"{_SCHEMA_EXTRAS}, {LOSS_SCHEMA}) -> {_CE_RESULTS}")
def cross_entropy_forward_backward_(logits, target, weight, grad_scale, argmax, entropy, logprob,
                                    *options):
    """As cross_entropy_forward_backward, with the gradient written over the logits."""
    return _ce_launch(logits, target, weight, logits, grad_scale, (argmax, entropy, logprob),
                      LossOptions(*options))


@cross_entropy_forward_backward_.register_fake
def _(logits, target, weight, grad_scale, argmax, entropy, logprob, *options):
    return _ce_results_like(logits, target, (argmax, entropy, logprob), options)


@_kernel("cross_entropy_rescale_", mutates_args=("grad",),
         schema=f"(Tensor(a!) grad, Tensor target, Tensor? weight, Tensor grad_output, "
                f"Tensor? applied, {_SCHEMA_EXTRAS}, {LOSS_SCHEMA}) -> ()")
def cross_entropy_rescale_(grad, target, weight, grad_output, applied, argmax, entropy, logprob,
                           *options):
    """grad (computed for upstream `applied`) becomes the gradient for `grad_output`; rows where
    the two are equal are not touched (checked on the device). The rescale reads no weights (they
    scale both gradients alike): weight and the extras, the forward's, only pick the forward's op
    handle, so that no other program is built for it."""
    op = cross_entropy_op(grad, target, LossOptions(*options), weight, argmax, entropy)
    op.rescale_gradient(_stream(grad.device), grad=as_matrix(grad, "grad"),
                        grad_output=as_vector(grad_output), applied=as_vector(applied))


# ---- Linear + cross-entropy --------------------------------------------------------------------

def linear_cross_entropy_op(hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                            has_bias: bool, weight_grad: bool, class_weight, want,
                            options: LossOptions, accumulation: str) -> LinearCrossEntropy:
    """The op handle. weight_grad: whether its launches compute d_weight or d_bias, which then add
    up over the chunks in fp32 (the accumulator, vocab x hidden x 4 bytes, lies in the workspace)
    and are rounded to the weight's dtype once, unless accumulation is "output_dtype"; without,
    the op has no accumulator, so a frozen lm_head (LoRA) or a forward alone costs no such
    workspace. Both share one compiled program. class_weight (its dtype) and want (argmax,
    entropy, logprob) pick the program's per-class weights and per-row outputs."""
    return _lce_op(hidden.device, weight.shape[0], weight.shape[1], dtype_name(hidden, "hidden"),
                   has_bias, index_name(target, "target"), weight_grad,
                   None if class_weight is None else dtype_name(class_weight, "class_weight"),
                   bool(want[0]), bool(want[1]), options, accumulation)


def _lce_op(device, vocab, hidden_size, dtype, has_bias, target_type, weight_grad,
            class_weight_dtype, argmax, entropy, options: LossOptions,
            accumulation: str) -> LinearCrossEntropy:
    spec = dict(vocab=vocab, hidden=hidden_size, dtype=dtype, bias=has_bias,
                target_type=target_type, argmax=argmax, entropy=entropy,
                class_weight_dtype=class_weight_dtype,
                weight_grad_accumulation="fp32" if weight_grad and accumulation == "fp32"
                else "output_dtype")
    return cached_op(device, ("linear_cross_entropy", options, *spec.values()),
                     lambda rt: rt.linear_cross_entropy(**spec, **options._asdict()))


def _lce_options(scalars: tuple) -> tuple:
    """A linear cross-entropy custom op's trailing scalars (_LCE_OPTIONS: LOSS_SCHEMA's, then the
    weight-gradient accumulation) as (LossOptions, accumulation)."""
    *options, accumulation = scalars
    return LossOptions(*options), accumulation


_LCE_OPTIONS = f"{LOSS_SCHEMA}, str accumulation"


def _lce_gradients_like(hidden, weight, bias, want_d_hidden, want_d_weight, want_d_bias):
    """d_hidden, d_weight and d_bias, each in its input's shape and dtype, or empty ([0]) when not
    wanted (a custom op returns tensors, not None)."""
    def like(t, wanted):
        if wanted:
            return torch.empty(t.shape, dtype=t.dtype, device=t.device)
        return torch.empty((0,), dtype=hidden.dtype, device=hidden.device)
    return (like(hidden, want_d_hidden), like(weight, want_d_weight),
            like(bias, want_d_bias and bias is not None))


def _lce_lse_like(hidden: torch.Tensor, extras: tuple) -> torch.Tensor:
    """The fused op's lse: [rows] with any extra asked for, else empty (not computed: an lse
    makes the loss kernel read ignored rows too)."""
    return torch.empty(hidden.shape[0] if any(extras) else 0, dtype=torch.float32,
                       device=hidden.device)


def _lce_launch(hidden, weight, target, bias, class_weight, grad_output, extras, want,
                scalars: tuple, gradient: bool):
    """The forward, or with `gradient` the forward and the gradients `want`ed in one pass."""
    options, accumulation = _lce_options(scalars)
    op = linear_cross_entropy_op(hidden, weight, target, bias is not None,
                                 gradient and (want[1] or want[2]), class_weight, extras, options,
                                 accumulation)
    rows = hidden.shape[0]
    loss, lse = _loss_like(hidden, options.reduction), _lce_lse_like(hidden, extras)
    per_row = _extras_like(hidden, target, *extras)
    workspace = _workspace(op.workspace_bytes, rows, hidden.device)
    fields = dict(hidden_states=as_matrix(hidden, "hidden"), weight=as_matrix(weight, "weight"),
                  bias=as_vector(bias), targets=as_index(target, "target"), loss=as_vector(loss),
                  lse=as_vector(lse if lse.numel() else None),
                  class_weight=as_vector(class_weight),
                  workspace=workspace.data_ptr(), workspace_bytes=workspace.numel(),
                  **_extras_fields(per_row, target))
    if not gradient:
        op.forward(_stream(hidden.device), **fields)
        return (loss, lse, *per_row)
    grads = _lce_gradients_like(hidden, weight, bias, *want)
    d_hidden, d_weight, d_bias = grads
    op.forward_backward(
        _stream(hidden.device), grad_output=as_vector(grad_output),
        d_hidden=as_matrix(d_hidden, "d_hidden") if want[0] else _capi.Tensor(),
        d_weight=as_matrix(d_weight, "d_weight") if want[1] else _capi.Tensor(),
        d_bias=as_vector(d_bias) if want[2] and bias is not None else _capi.Tensor(), **fields)
    return (loss, lse, *per_row, *grads)


def _lce_results_like(hidden, target, extras, scalars) -> tuple:
    """A launch's loss, lse and extras, as the fake ops return them."""
    return (_loss_like(hidden, _lce_options(scalars)[0].reduction), _lce_lse_like(hidden, extras),
            *_extras_like(hidden, target, *extras))


@_kernel("linear_cross_entropy_forward", mutates_args=(),
         schema="(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, Tensor? class_weight, "
                f"{_SCHEMA_EXTRAS}, {_LCE_OPTIONS}) -> {_CE_RESULTS}")
def linear_cross_entropy_forward(hidden, weight, target, bias, class_weight, argmax, entropy,
                                 logprob, *options):
    """The loss, lse and the extras asked for of the logits hidden @ weight.T + bias; no
    gradient."""
    return _lce_launch(hidden, weight, target, bias, class_weight, None,
                       (argmax, entropy, logprob), (False,) * 3, options, gradient=False)


@linear_cross_entropy_forward.register_fake
def _(hidden, weight, target, bias, class_weight, argmax, entropy, logprob, *options):
    return _lce_results_like(hidden, target, (argmax, entropy, logprob), options)


@_kernel("linear_cross_entropy_forward_backward", mutates_args=(),
         schema="(Tensor hidden, Tensor weight, Tensor target, Tensor? bias, Tensor? class_weight, "
                f"Tensor? grad_output, {_SCHEMA_EXTRAS}, bool d_hidden, bool d_weight, "
                f"bool d_bias, {_LCE_OPTIONS}) -> (Tensor, Tensor, Tensor, Tensor, Tensor, "
                "Tensor, Tensor, Tensor)")
def linear_cross_entropy_forward_backward(hidden, weight, target, bias, class_weight,
                                          grad_output, argmax, entropy, logprob, d_hidden,
                                          d_weight, d_bias, *options):
    """The loss, lse, the extras and the gradients asked for (each in its input's shape and
    dtype, else empty), for upstream gradient grad_output (fp32 [1] or [rows]; 1 when None), in
    one pass."""
    return _lce_launch(hidden, weight, target, bias, class_weight, grad_output,
                       (argmax, entropy, logprob), (d_hidden, d_weight, d_bias), options,
                       gradient=True)


@linear_cross_entropy_forward_backward.register_fake
def _(hidden, weight, target, bias, class_weight, grad_output, argmax, entropy, logprob, d_hidden,
      d_weight, d_bias, *options):
    return (*_lce_results_like(hidden, target, (argmax, entropy, logprob), options),
            *_lce_gradients_like(hidden, weight, bias, d_hidden, d_weight, d_bias))


@_kernel("linear_cross_entropy_rescale_", mutates_args=("grad",),
         schema="(Tensor(a!) grad, str which, Tensor grad_output, Tensor? applied, int vocab, "
                "int hidden_size, bool bias, str target_type, bool weight_grad, "
                "str? class_weight_dtype, bool argmax, bool entropy, "
                f"{_LCE_OPTIONS}) -> ()")
def linear_cross_entropy_rescale_(grad, which, grad_output, applied, vocab, hidden_size, bias,
                                  target_type, weight_grad, class_weight_dtype, argmax, entropy,
                                  *options):
    """grad, the forward_backward's `which` ("d_hidden", "d_weight" or "d_bias", in the op's
    dtype) computed for upstream gradient `applied` (None: 1), becomes the gradient for
    grad_output (fp32 [1]); untouched when the two are equal (checked on the device). The spec
    names the forward's op handle, whose program is built already."""
    op = _lce_op(grad.device, vocab, hidden_size, dtype_name(grad, which), bias, target_type,
                 weight_grad, class_weight_dtype, argmax, entropy, *_lce_options(options))
    view = as_vector(grad) if which == "d_bias" else as_matrix(grad, which)
    op.rescale_gradients(_stream(grad.device), **{which: view},
                         grad_output=as_vector(grad_output), applied=as_vector(applied))


# ---- Per-token log-probabilities and entropy (RL heads) ---------------------------------------

def log_probs_op(logits: torch.Tensor, target: torch.Tensor, temperature: float,
                 ignore_index: int, entropy: bool) -> LogProbs:
    """The op handle (kjit/log_probs.h): one program per vocab, dtype, target type and whether
    the entropy is computed; the temperature and ignore_index are launch arguments' values
    compiled in as the other ops' options are."""
    spec = dict(vocab=logits.shape[-1], dtype=dtype_name(logits, "logits"),
                target_type=index_name(target, "target"), ignore_index=int(ignore_index),
                temperature=float(temperature), entropy=bool(entropy))
    return cached_op(logits.device, ("log_probs", *spec.values()),
                     lambda rt: rt.log_probs(**spec))


def _row_outputs_like(rows: int, device, entropy: bool) -> tuple:
    """logprob [rows], entropy ([rows], or empty when not asked) and lse [rows], fp32."""
    return (torch.empty(rows, dtype=torch.float32, device=device),
            torch.empty(rows if entropy else 0, dtype=torch.float32, device=device),
            torch.empty(rows, dtype=torch.float32, device=device))


@_kernel("log_probs_forward", mutates_args=(),
         schema="(Tensor logits, Tensor target, float temperature, int ignore_index, "
                "bool entropy) -> (Tensor, Tensor, Tensor)")
def log_probs_forward(logits, target, temperature, ignore_index, entropy):
    """Per row of logits [rows, vocab] (any row stride) and target [rows]: log softmax(z / T) at
    the target, the entropy of softmax(z / T) when asked, and the lse of z / T, all fp32 [rows];
    the first two 0 for a row whose target is ignore_index (or outside the vocab). No gradient:
    nothing but these is written."""
    op = log_probs_op(logits, target, temperature, ignore_index, entropy)
    logprob, ent, lse = _row_outputs_like(logits.shape[0], logits.device, entropy)
    op.forward(_stream(logits.device), logits=as_matrix(logits, "logits"),
               targets=as_index(target, "target"), logprob=as_vector(logprob),
               entropy=as_vector(ent) if entropy else _capi.Tensor(), lse=as_vector(lse))
    return logprob, ent, lse


@log_probs_forward.register_fake
def _(logits, target, temperature, ignore_index, entropy):
    return _row_outputs_like(logits.shape[0], logits.device, entropy)


def _log_probs_backward_launch(logits, target, lse, entropy, grad_logprob, grad_entropy, grad,
                               temperature, ignore_index):
    op = log_probs_op(logits, target, temperature, ignore_index, entropy.numel() > 0)
    op.backward(_stream(logits.device), logits=as_matrix(logits, "logits"),
                targets=as_index(target, "target"), lse=as_vector(lse),
                entropy=as_vector(entropy) if entropy.numel() else _capi.Tensor(),
                grad_logprob=as_vector(grad_logprob), grad_entropy=as_vector(grad_entropy),
                grad=grad if isinstance(grad, _capi.Tensor) else as_matrix(grad, "grad"))


_LP_BACKWARD = ("Tensor target, Tensor lse, Tensor entropy, Tensor? grad_logprob, "
                "Tensor? grad_entropy, float temperature, int ignore_index")


@_kernel("log_probs_backward", mutates_args=(),
         schema=f"(Tensor logits, {_LP_BACKWARD}) -> Tensor")
def log_probs_backward(logits, target, lse, entropy, grad_logprob, grad_entropy, temperature,
                       ignore_index):
    """d_logits for per-row upstream gradients of the log-probability and of the entropy (fp32
    [rows], either None: its term is left out) from the forward's lse and entropy (the entropy
    is needed only with grad_entropy), in a new tensor in the logits' dtype:
      d z_j = (g_lp (1[j = t] - p_j) - g_H p_j (log p_j + H)) / T,  p = softmax(z / T),
    zeros for an ignored row."""
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    _log_probs_backward_launch(logits, target, lse, entropy, grad_logprob, grad_entropy, grad,
                               temperature, ignore_index)
    return grad


@log_probs_backward.register_fake
def _(logits, target, lse, entropy, grad_logprob, grad_entropy, temperature, ignore_index):
    return torch.empty_like(logits, memory_format=torch.contiguous_format)


@_kernel("log_probs_backward_", mutates_args=("logits",),
         schema=f"(Tensor(a!) logits, {_LP_BACKWARD}) -> ()")
def log_probs_backward_(logits, target, lse, entropy, grad_logprob, grad_entropy, temperature,
                        ignore_index):
    """As log_probs_backward, the gradient written over the logits."""
    _log_probs_backward_launch(logits, target, lse, entropy, grad_logprob, grad_entropy,
                               as_matrix(logits, "logits"), temperature, ignore_index)


# ---- RMSNorm -----------------------------------------------------------------------------------

def rms_norm_op(x, weight, eps, offset, casting, fused_residual) -> RmsNorm:
    spec = dict(hidden=x.shape[-1], dtype=dtype_name(x, "x"),
                weight_dtype=dtype_name(weight, "weight"), eps=eps, weight_offset=offset,
                casting=casting, fused_residual=fused_residual)
    return cached_op(x.device, ("rms_norm", *spec.values()), lambda rt: rt.rms_norm(**spec))


def _rstd_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape[:-1], dtype=torch.float32, device=x.device)


_NORM_OPTIONS = "float eps, float offset, str casting"


@_kernel("rms_norm_forward", mutates_args=(),
         schema=f"(Tensor x, Tensor weight, Tensor? residual, {_NORM_OPTIONS}) "
                                "-> (Tensor, Tensor, Tensor)")
def rms_norm_forward(x, weight, residual, eps, offset, casting):
    """y, rstd and (with a residual) h = x + residual, which y normalizes; else h is empty."""
    op = rms_norm_op(x, weight, eps, offset, casting, residual is not None)
    y, rstd = torch.empty(x.shape, dtype=x.dtype, device=x.device), _rstd_like(x)
    h = torch.empty(x.shape if residual is not None else (0,), dtype=x.dtype, device=x.device)
    op.forward(_stream(x.device), x=as_matrix(x, "x"), weight=as_matrix(weight, "weight"),
               y=as_matrix(y, "y"), rstd=as_vector(rstd), residual=as_matrix(residual, "residual"),
               residual_out=as_matrix(h, "h") if residual is not None else _capi.Tensor())
    return y, rstd, h


@rms_norm_forward.register_fake
def _(x, weight, residual, eps, offset, casting):
    h_shape = x.shape if residual is not None else (0,)
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device), _rstd_like(x),
            torch.empty(h_shape, dtype=x.dtype, device=x.device))


@_kernel("rms_norm_backward", mutates_args=(),
         schema=f"(Tensor dy, Tensor x, Tensor weight, Tensor rstd, "
                                f"Tensor? dresidual, {_NORM_OPTIONS}, bool fused_residual) "
                                "-> (Tensor, Tensor)")
def rms_norm_backward(dy, x, weight, rstd, dresidual, eps, offset, casting, fused_residual):
    """dx (plus dresidual when given) and dw; fused_residual as the forward had it (one program
    serves both directions)."""
    op = rms_norm_op(x, weight, eps, offset, casting, fused_residual)
    rows = matrix_shape(x, "x")[0]
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dw = torch.empty(weight.shape, dtype=weight.dtype, device=weight.device)
    workspace = _workspace(op.backward_workspace_bytes, rows, x.device)
    op.backward(_stream(x.device), dy=as_matrix(dy, "dy"), x=as_matrix(x, "x"),
                weight=as_matrix(weight, "weight"), rstd=as_vector(rstd), dx=as_matrix(dx, "dx"),
                dw=as_matrix(dw, "dw"), dresidual=as_matrix(dresidual, "dresidual"),
                workspace=workspace.data_ptr(), workspace_bytes=workspace.numel())
    return dx, dw


@rms_norm_backward.register_fake
def _(dy, x, weight, rstd, dresidual, eps, offset, casting, fused_residual):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(weight.shape, dtype=weight.dtype, device=weight.device))
