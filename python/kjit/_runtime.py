"""kjit's ops from Python without torch: a Runtime and its op handles over the C API.

Launches take device pointers described by kjit.tensor()/kjit.index() and a stream (an int or
None for the legacy default stream); kjit.torch builds these from torch tensors.

    rt = kjit.Runtime()                                   # GPU 0
    ce = rt.cross_entropy(vocab=128256, dtype="bf16")
    ws = ce.workspace_bytes(rows)
    ce.forward_backward(stream, logits=kjit.tensor(ptr, "bf16", rows, 128256), ...)
    lce = rt.linear_cross_entropy(vocab=128256, hidden=4096, dtype="bf16")   # lm_head + loss
    kjit.Runtime(target="sm_90", compile_only=True).rms_norm(4096).build()   # no GPU needed
"""

from __future__ import annotations

import ctypes
import json
import os
import warnings as _warnings
from typing import Callable, Optional, Union

from kjit import _capi
from kjit._loss_options import LossOptions


PathArg = Union[str, bytes, os.PathLike]


class KjitWarning(UserWarning):
    """A warning from the library (an unreadable tuning database, an unwritable cache...)."""


def _choice(what: str, value: str, table: dict) -> int:
    if value not in table:
        raise ValueError(f"{what}: expected one of {', '.join(map(repr, table))}, got "
                         f"{_capi.quoted(value)}")
    return table[value]


def _fill_loss(loss, what: str, options: LossOptions, *, target_type: str, argmax, entropy,
               class_weight_dtype: Optional[str]) -> None:
    """Sets a spec's embedded kjit_loss_options: the loss options and the fields that pick the
    program (the target type, the per-row outputs, the class weights' dtype)."""
    _capi.fill(loss, what, dict(
        options._asdict(), target_type=_choice("target_type", target_type, _capi.INDEX_TYPES),
        reduction=_choice("reduction", options.reduction, _capi.REDUCTIONS),
        argmax=_capi.flag("argmax", argmax), entropy=_capi.flag("entropy", entropy),
        class_weight_dtype=-1 if class_weight_dtype is None else _choice(
            "class_weight_dtype", class_weight_dtype, _capi.DTYPES)))


def _loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap) -> LossOptions:
    """The loss keywords as one value, softcap None meaning off (0); checked where they fill the
    spec."""
    return LossOptions(ignore_index, reduction, label_smoothing, z_loss,
                       0.0 if softcap is None else softcap)


def tensor(data: int, dtype: str, rows: int, cols: int, row_stride: Optional[int] = None):
    """rows x cols elements of dtype ("fp32", "fp16", "bf16") at device address `data`."""
    return _capi.fill(_capi.Tensor(), "tensor", dict(
        data=data, dtype=_choice("dtype", dtype, _capi.DTYPES), rows=rows, cols=cols,
        row_stride=cols if row_stride is None else row_stride))


def vector(data: int, dtype: str, n: int):
    return tensor(data, dtype, 1, n, n)


def index(data: int, type: str, size: int):
    """A contiguous vector of `size` int32 or int64 at device address `data`."""
    return _capi.fill(_capi.Index(), "index", dict(
        data=data, type=_choice("index type", type, _capi.INDEX_TYPES), size=size))


class _Handle:
    """Owns one C handle; destroys it with the C API when collected."""

    _destroy = ""

    def __init__(self, handle: ctypes.c_void_p, keep=None, sink=None):
        self._handle = handle
        # Looked up now: at interpreter exit __del__ may run after this module's globals (_capi)
        # are gone.
        self._destroy_function = getattr(_capi.lib(), self._destroy)
        self._keep = keep  # what must outlive the handle (the runtime, its warning callback)
        # Where the calls' warnings go (the runtime's, for an op): what it raised is raised.
        self._sink = sink if sink is not None else getattr(keep, "_sink", None)

    def _call(self, function: str, *args) -> None:
        _capi.call(function, *args, sink=self._sink)

    def _call_string(self, function: str, *args) -> str:
        return _capi.call_string(function, *args, sink=self._sink)

    def _call_int64(self, function: str, *args) -> int:
        return _capi.call_int64(function, *args, sink=self._sink)

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value:
            self._destroy_function(handle)
            self._handle = None

    def _launch(self, method: str, function: str, struct_type, stream, fields: dict) -> None:
        """`method` (the Python name, for errors) calls C `function` with an args struct of
        `fields`."""
        # An args struct's defaults are all zero (kjit_*_args_init), so the constructor sets it.
        args = _capi.fill(struct_type(ctypes.sizeof(struct_type)),
                          f"{type(self).__name__}.{method}()", fields)
        self._call(function, self._handle, _capi.stream(stream), ctypes.byref(args))


class RmsNorm(_Handle):
    """An RMSNorm op for one hidden size and dtype (kjit/rms_norm.h says what it computes)."""

    _destroy = "kjit_rms_norm_destroy"

    def forward(self, stream, **fields) -> None:
        """fields: x, weight, y, rstd, residual, residual_out (kjit.tensor values)."""
        self._launch("forward", "kjit_rms_norm_forward", _capi.RmsNormForwardArgs, stream, fields)

    def backward(self, stream, **fields) -> None:
        """fields: dy, x, weight, rstd, dx, dw, dresidual, workspace, workspace_bytes."""
        self._launch("backward", "kjit_rms_norm_backward",
                     _capi.RmsNormBackwardArgs, stream, fields)

    def backward_workspace_bytes(self, rows: int) -> int:
        return self._call_int64("kjit_rms_norm_backward_workspace_bytes", self._handle,
                                _capi.integer("rows", rows))

    def config_for(self, rows: int) -> str:
        return self._call_string("kjit_rms_norm_config_for", self._handle,
                                 _capi.integer("rows", rows))

    def build(self) -> dict:
        """Compiles (or finds in the caches) the op's kernels; works compile-only."""
        return json.loads(self._call_string("kjit_rms_norm_build", self._handle))


class CrossEntropy(_Handle):
    """A fused cross-entropy op for one vocab, dtype and option set (kjit/cross_entropy.h)."""

    _destroy = "kjit_cross_entropy_destroy"

    def forward(self, stream, **fields) -> None:
        """fields: logits, targets, loss, lse, argmax, entropy (iff the op was made with
        entropy=True), target_logprob (optional), workspace, workspace_bytes, and class_weight (a
        [vocab] vector) iff the op was made with class_weight_dtype."""
        self._launch("forward", "kjit_cross_entropy_forward",
                     _capi.CrossEntropyArgs, stream, fields)

    def forward_backward(self, stream, **fields) -> None:
        """forward's fields plus grad (may be logits: in place) and grad_output."""
        self._launch("forward_backward", "kjit_cross_entropy_forward_backward",
                     _capi.CrossEntropyArgs, stream, fields)

    def backward(self, stream, **fields) -> None:
        """fields: logits, targets, lse, grad_output, grad, workspace, workspace_bytes,
        class_weight (as for forward)."""
        self._launch("backward", "kjit_cross_entropy_backward",
                     _capi.CrossEntropyBackwardArgs, stream, fields)

    def rescale_gradient(self, stream, **fields) -> None:
        """fields: grad, grad_output, applied (see kjit_cross_entropy_rescale_args); no class
        weights, even for an op that has them."""
        self._launch("rescale_gradient", "kjit_cross_entropy_rescale_gradient",
                     _capi.CrossEntropyRescaleArgs, stream, fields)

    def workspace_bytes(self, rows: int) -> int:
        return self._call_int64("kjit_cross_entropy_workspace_bytes", self._handle,
                                _capi.integer("rows", rows))

    def config_for(self, rows: int, fused: bool = True) -> str:
        return self._call_string("kjit_cross_entropy_config_for", self._handle,
                                 _capi.integer("rows", rows), _capi.flag("fused", fused))

    def build(self) -> dict:
        return json.loads(self._call_string("kjit_cross_entropy_build", self._handle))


class LinearCrossEntropy(_Handle):
    """lm_head and the cross-entropy fused, from the hidden states to the loss and the gradients
    of the hidden states, weight and bias, in chunks of rows: memory that does not grow with the
    rows (kjit/linear_cross_entropy.h)."""

    _destroy = "kjit_linear_cross_entropy_destroy"

    def forward(self, stream, **fields) -> None:
        """fields: hidden_states, weight, bias (iff the op has one), targets, loss, lse, argmax
        (iff the op has it), entropy (iff the op has it), target_logprob (optional), class_weight
        (iff the op has class_weight_dtype), workspace, workspace_bytes (kjit.tensor / kjit.index values)."""
        self._launch("forward", "kjit_linear_cross_entropy_forward",
                     _capi.LinearCrossEntropyArgs, stream, fields)

    def forward_backward(self, stream, **fields) -> None:
        """forward's fields plus grad_output and the gradients wanted, each optional: d_hidden,
        d_weight, d_bias; accumulate=1 adds d_weight and d_bias to what they hold."""
        self._launch("forward_backward", "kjit_linear_cross_entropy_forward_backward",
                     _capi.LinearCrossEntropyArgs, stream, fields)

    def rescale_gradients(self, stream, **fields) -> None:
        """fields: d_hidden, d_weight, d_bias (each optional), grad_output and applied (see
        kjit_linear_cross_entropy_rescale_args): nothing is touched when they are equal."""
        self._launch("rescale_gradients", "kjit_linear_cross_entropy_rescale_gradients",
                     _capi.LinearCrossEntropyRescaleArgs, stream, fields)

    def workspace_bytes(self, rows: int) -> int:
        """Device memory (256-byte aligned) a launch of `rows` needs, the fp32 weight-gradient
        accumulator included."""
        return self._call_int64("kjit_linear_cross_entropy_workspace_bytes", self._handle,
                                _capi.integer("rows", rows))

    def accumulator_bytes(self, rows: int) -> int:
        """The part of workspace_bytes(rows) the fp32 weight-gradient accumulator takes (0 when
        the rows fit one chunk, with output-dtype accumulation or an fp32 d_weight)."""
        return self._call_int64("kjit_linear_cross_entropy_accumulator_bytes", self._handle,
                                _capi.integer("rows", rows))

    def config_for(self, rows: int) -> str:
        return self._call_string("kjit_linear_cross_entropy_config_for", self._handle,
                                 _capi.integer("rows", rows))

    def build(self) -> dict:
        return json.loads(self._call_string("kjit_linear_cross_entropy_build", self._handle))


class ShardedCrossEntropy(_Handle):
    """The vocab-parallel cross-entropy of one shard [shard_start, shard_end) of the vocab
    (kjit/sharded_cross_entropy.h): each rank runs compute_stats, a reduction of the statistics
    across the ranks, then finish, all on one stream.

        op = rt.sharded_cross_entropy(vocab=128256, shard_start=r * 32064,
                                      shard_end=(r + 1) * 32064)
        op.compute_stats(stream, logits=..., targets=..., loss=..., workspace=ws,
                         workspace_bytes=op.workspace_bytes(rows))
        max_ptr, sums_ptr = op.stats_of(ws, rows)   # all-reduce max_ptr's rows floats (max),
        op.rescale_stats(stream, ws, rows)           # then sums_ptr's 3 * rows floats (sum)
        op.finish(stream, logits=..., grad=..., ...)  # the same fields as compute_stats
    """

    _destroy = "kjit_sharded_cross_entropy_destroy"

    def compute_stats(self, stream, **fields) -> None:
        """fields: logits ([rows, width], the shard's columns), targets (classes of the whole
        vocab), loss, lse, class_weight (the whole [vocab], iff the op has class_weight_dtype),
        workspace, workspace_bytes; grad and grad_output are finish's, and may be given here too
        (the same fields for every step)."""
        self._launch("compute_stats", "kjit_sharded_cross_entropy_compute_stats",
                     _capi.ShardedCrossEntropyArgs, stream, fields)

    def finish(self, stream, **fields) -> None:
        """compute_stats's fields, plus grad (the shard's gradient, may be logits) and
        grad_output: the whole row's loss and lse, the shard's gradient."""
        self._launch("finish", "kjit_sharded_cross_entropy_finish",
                     _capi.ShardedCrossEntropyArgs, stream, fields)

    def run(self, stream, nccl_comm: int, **fields) -> None:
        """compute_stats, the all-reduces over `nccl_comm` (an ncclComm_t's address) and
        finish."""
        args = _capi.fill(_capi.ShardedCrossEntropyArgs(
            ctypes.sizeof(_capi.ShardedCrossEntropyArgs)), "ShardedCrossEntropy.run()", fields)
        self._call("kjit_sharded_cross_entropy_run", self._handle, _capi.stream(stream),
                   ctypes.byref(args), _capi.pointer("nccl_comm", nccl_comm))

    def all_reduce_stats(self, stream, workspace: int, rows: int, nccl_comm: int) -> None:
        """The reduction over NCCL: `nccl_comm` is an ncclComm_t's address."""
        self._call("kjit_sharded_cross_entropy_all_reduce_stats", self._handle,
                   _capi.stream(stream), _capi.pointer("workspace", workspace),
                   _capi.integer("rows", rows), _capi.pointer("nccl_comm", nccl_comm))

    def stats_of(self, workspace: int, rows: int) -> tuple:
        """(max, sums): the addresses of the statistics in `workspace` (arithmetic, nothing is
        read): `rows` floats to all-reduce with max, then 3 * rows floats with sum."""
        max_out, sums_out = ctypes.c_void_p(), ctypes.c_void_p()
        self._call("kjit_sharded_cross_entropy_stats_of", self._handle,
                   _capi.pointer("workspace", workspace), _capi.integer("rows", rows),
                   ctypes.byref(max_out), ctypes.byref(sums_out))
        return max_out.value, sums_out.value

    def rescale_stats(self, stream, workspace: int, rows: int) -> None:
        """Between the two all-reduces: the shard's sums rescaled to the all-reduced max."""
        self._call("kjit_sharded_cross_entropy_rescale_stats", self._handle,
                   _capi.stream(stream), _capi.pointer("workspace", workspace),
                   _capi.integer("rows", rows))

    def workspace_bytes(self, rows: int) -> int:
        return self._call_int64("kjit_sharded_cross_entropy_workspace_bytes", self._handle,
                                _capi.integer("rows", rows))

    def config(self) -> str:
        """The config every launch uses ("vec=8 threads=256 unroll=4 cluster=0 staged=0")."""
        return self._call_string("kjit_sharded_cross_entropy_config", self._handle)

    def build(self) -> dict:
        return json.loads(self._call_string("kjit_sharded_cross_entropy_build", self._handle))


class LogProbs(_Handle):
    """The RL heads of a policy's logits for one vocab, dtype and temperature (kjit/log_probs.h):
    per row, log softmax(z / T)[target] and the entropy of softmax(z / T), and their gradient."""

    _destroy = "kjit_log_probs_destroy"

    def forward(self, stream, **fields) -> None:
        """fields: logits, targets, logprob, entropy (iff the op was made with entropy=True),
        lse (optional, what backward needs)."""
        self._launch("forward", "kjit_log_probs_forward", _capi.LogProbsArgs, stream, fields)

    def backward(self, stream, **fields) -> None:
        """fields: logits, targets, lse, entropy (with grad_entropy), grad_logprob and
        grad_entropy (each optional), grad (may be logits: in place)."""
        self._launch("backward", "kjit_log_probs_backward",
                     _capi.LogProbsBackwardArgs, stream, fields)

    def config(self) -> str:
        return self._call_string("kjit_log_probs_config", self._handle)

    def build(self) -> dict:
        return json.loads(self._call_string("kjit_log_probs_build", self._handle))


class Op(_Handle):
    """An op made by name (the C API's kjit_op_*): every op added after the RL heads is offered only
    so, and RMSNorm too (beside kjit.RmsNorm). Its passes, their arguments and its spec's fields and
    defaults are in op_schema(); each argument is named as in the C++ args struct.

        norm = rt.op("rms_norm", hidden=4096, dtype="bf16")
        norm.launch("forward", stream, x=kjit.tensor(...), weight=..., y=...)
        norm.launch("backward", stream, ..., workspace=ws,
                    workspace_bytes=norm.workspace_bytes("backward", rows))
    """

    _destroy = "kjit_op_destroy"

    def spec(self) -> dict:
        """The spec, every field given ({"op": "rms_norm", "hidden": 4096, ...})."""
        return json.loads(self._call_string("kjit_op_spec", self._handle))

    def launch(self, pass_name: str, stream, *, workspace: Optional[int] = None,
               workspace_bytes: int = 0, **arguments) -> None:
        """Launches the pass `pass_name` ("forward") with `arguments` by name, each a
        kjit.tensor() or kjit.index() (None: not given); a name the pass does not take is a
        KjitInvalidArgument listing those it takes."""
        what = f"Op.launch({pass_name!r})"
        tensors, indexes = [], []
        for name, value in arguments.items():
            if value is None:
                continue
            if isinstance(value, _capi.Tensor):
                tensors.append(_capi.NamedTensor(name.encode(), value))
            elif isinstance(value, _capi.Index):
                indexes.append(_capi.NamedIndex(name.encode(), value))
            else:
                raise TypeError(f"{what}: {name}: expected a kjit.tensor() or kjit.index() (or "
                                f"None), got {_capi.quoted(value)}")
        tensor_array = (_capi.NamedTensor * max(len(tensors), 1))(*tensors)
        index_array = (_capi.NamedIndex * max(len(indexes), 1))(*indexes)
        args = _capi.OpArgs(ctypes.sizeof(_capi.OpArgs))
        args.tensors, args.tensor_count = tensor_array, len(tensors)
        args.indexes, args.index_count = index_array, len(indexes)
        args.workspace = None if workspace is None else _capi.pointer("workspace", workspace)
        args.workspace_bytes = _capi.integer("workspace_bytes", workspace_bytes)
        self._call("kjit_op_launch", self._handle, _capi.c_string("pass", pass_name),
                   _capi.stream(stream), ctypes.byref(args))

    def workspace_bytes(self, pass_name: str, rows: int) -> int:
        """The workspace a launch of `pass_name` over `rows` needs (0: it takes none)."""
        return self._call_int64("kjit_op_workspace_bytes", self._handle,
                                _capi.c_string("pass", pass_name), _capi.integer("rows", rows))

    def config_for(self, rows: int) -> str:
        return self._call_string("kjit_op_config_for", self._handle, _capi.integer("rows", rows))

    def build(self) -> dict:
        """Compiles (or finds in the caches) the op's kernels; works compile-only."""
        return json.loads(self._call_string("kjit_op_build", self._handle))


def op_schema() -> dict:
    """The ops kjit.Runtime.op makes: {"abi_version": 6, "ops": [{"op", "spec" (the defaults),
    "config", "config_for", "passes": [{"pass", "tensors", "indexes", "workspace"}]}]}."""
    return json.loads(_capi.call_string("kjit_op_schema"))


def combine_stats(stream, shards, rows: int) -> None:
    """The reduction for shards held by this process: `shards` is a sequence of (op, workspace)
    pairs, ShardedCrossEntropy ops that tile [0, vocab) in order, each after its compute_stats on
    `stream`."""
    shards = list(shards)
    handles = (ctypes.c_void_p * max(len(shards), 1))()
    workspaces = (ctypes.c_void_p * max(len(shards), 1))()
    sink = None
    for i, pair in enumerate(shards):
        try:
            op, workspace = pair
        except (TypeError, ValueError):
            raise TypeError(f"shards[{i}]: expected an (op, workspace) pair, got "
                            f"{type(pair).__name__}") from None
        if not isinstance(op, ShardedCrossEntropy):
            raise TypeError(f"shards[{i}]: expected a ShardedCrossEntropy op, got "
                            f"{type(op).__name__}")
        handles[i] = op._handle.value
        workspaces[i] = _capi.pointer(f"shards[{i}] workspace", workspace)
        sink = op._sink
    _capi.call("kjit_sharded_cross_entropy_combine_stats", _capi.stream(stream), handles,
               workspaces, _capi.integer("len(shards)", len(shards), ctypes.c_int32),
               _capi.integer("rows", rows), sink=sink)


class Runtime(_Handle):
    """kjit's entry point: one GPU (or a compile-only target), its kernel caches, its ops.

    device: the CUDA ordinal. target: "" for the device's own arch, else "sm_90"... compile_only:
    build and cache kernels without a driver (needs target). cache_dir/tuning_db: as
    kjit::RuntimeOptions (None follows $KJIT_CACHE_DIR / $KJIT_TUNING_DB), each a str, bytes or
    os.PathLike. warnings: a callable taking the message; by default each becomes a KjitWarning.
    """

    _destroy = "kjit_runtime_destroy"

    def __init__(self, device: int = 0, *, target: Optional[str] = None,
                 compile_only: bool = False, disk_cache: bool = True,
                 cache_dir: Optional[PathArg] = None, tuning_db: Optional[PathArg] = None,
                 autotune: bool = False, warnings: Optional[Callable[[str], None]] = None):
        if warnings is not None and not callable(warnings):
            raise TypeError(f"warnings: expected a callable taking the message, got "
                            f"{type(warnings).__name__}")
        sink = _capi.WarningSink(
            warnings or (lambda message: _warnings.warn(message, KjitWarning, stacklevel=2)))
        options = _capi.init(_capi.RuntimeOptions, "kjit_runtime_options_init")
        _capi.fill(options, "Runtime()", dict(
            device=device, target=_capi.c_string("target", target),
            compile_only=_capi.flag("compile_only", compile_only),
            disk_cache=_capi.flag("disk_cache", disk_cache),
            cache_dir=_capi.c_string("cache_dir", cache_dir, path=True),
            tuning_db=_capi.c_string("tuning_db", tuning_db, path=True),
            autotune=_capi.flag("autotune", autotune), warning=sink.callback))
        handle = ctypes.c_void_p()
        # Owned before a warning's exception can leave: collected, the handle is destroyed.
        super().__init__(handle, keep=sink, sink=sink)
        self._call("kjit_runtime_create", ctypes.byref(options), ctypes.byref(handle))
        self._info = json.loads(self._call_string("kjit_runtime_info", self._handle))

    def info(self) -> dict:
        """{"target", "arch", "compile_only", "device": {"name", "compute_capability", ...}}."""
        return dict(self._info)

    @property
    def target(self) -> str:
        return self._info["target"]

    def op(self, op: str, **spec) -> Op:
        """The op `op` ("rms_norm", or any name op_schema() lists) for `spec`, its fields by their
        names in the spec JSON (`kjit-tune --spec`'s); a field left out takes its default, config
        (a string) overrides the tuned or heuristic config."""
        if not isinstance(op, str):
            raise TypeError(f"op: expected an op's name (a str), got {_capi.quoted(op)}")
        try:
            text = json.dumps({"op": op, **spec}, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise TypeError(f"op({op!r}): a spec field is not a JSON value (str, int, float, "
                            f"bool): {e}") from None
        made = Op(ctypes.c_void_p(), keep=self)  # owns the handle before a warning can raise
        self._call("kjit_op_create", self._handle, _capi.c_string("spec", text),
                   ctypes.byref(made._handle))
        return made

    def rms_norm(self, hidden: int, dtype: str = "bf16", *, weight_dtype: Optional[str] = None,
                 eps: float = 1e-6, weight_offset: float = 0.0, casting: str = "llama",
                 fused_residual: bool = False, config: Optional[str] = None) -> RmsNorm:
        spec = _capi.init(_capi.RmsNormSpec, "kjit_rms_norm_spec_init")
        _capi.fill(spec, "rms_norm()", dict(
            hidden=hidden, dtype=_choice("dtype", dtype, _capi.DTYPES),
            weight_dtype=-1 if weight_dtype is None else _choice(
                "weight_dtype", weight_dtype, _capi.DTYPES),
            eps=eps, weight_offset=weight_offset,
            casting=_choice("casting", casting, _capi.CASTINGS),
            fused_residual=_capi.flag("fused_residual", fused_residual), config=_capi.c_string("config", config)))
        op = RmsNorm(ctypes.c_void_p(), keep=self)  # owns the handle before a warning can raise
        self._call("kjit_rms_norm_create", self._handle, ctypes.byref(spec),
                   ctypes.byref(op._handle))
        return op

    def cross_entropy(self, vocab: int, dtype: str = "bf16", *, target_type: str = "int64",
                      ignore_index: int = -100, reduction: str = "mean",
                      label_smoothing: float = 0.0, z_loss: float = 0.0,
                      softcap: Optional[float] = None, argmax: bool = False,
                      entropy: bool = False, class_weight_dtype: Optional[str] = None,
                      config: Optional[str] = None) -> CrossEntropy:
        """The loss options (target_type ... class_weight_dtype) are every loss op's, with the
        same names (kjit/loss_options.h): z_loss adds z_loss * lse^2 per row; softcap None or 0 is
        off; class_weight_dtype None (no class weights), else "fp32" or dtype: the launches then
        take class_weight, a [vocab] vector of per-class weights (F.cross_entropy's `weight`)."""
        spec = _capi.init(_capi.CrossEntropySpec, "kjit_cross_entropy_spec_init")
        _capi.fill(spec, "cross_entropy()", dict(
            vocab=vocab, dtype=_choice("dtype", dtype, _capi.DTYPES),
            config=_capi.c_string("config", config)))
        _fill_loss(spec.loss, "cross_entropy()",
                   _loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap),
                   target_type=target_type, argmax=argmax, entropy=entropy,
                   class_weight_dtype=class_weight_dtype)
        op = CrossEntropy(ctypes.c_void_p(), keep=self)
        self._call("kjit_cross_entropy_create", self._handle, ctypes.byref(spec),
                   ctypes.byref(op._handle))
        return op

    def linear_cross_entropy(self, vocab: int, hidden: int, dtype: str = "bf16", *,
                             weight_grad_dtype: Optional[str] = None, bias: bool = False,
                             target_type: str = "int64", ignore_index: int = -100,
                             reduction: str = "mean", label_smoothing: float = 0.0,
                             z_loss: float = 0.0, softcap: Optional[float] = None,
                             argmax: bool = False, entropy: bool = False,
                             class_weight_dtype: Optional[str] = None,
                             weight_grad_accumulation: str = "fp32",
                             config: Optional[str] = None) -> LinearCrossEntropy:
        """The loss options as cross_entropy() takes them.
        weight_grad_dtype: d_weight's and d_bias's, None (dtype) or "fp32".
        weight_grad_accumulation: "fp32" (an fp32 accumulator in the workspace unless d_weight is
        fp32 itself) or "output_dtype" (straight into d_weight). config: None (tuned or
        heuristic) or "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0"."""
        spec = _capi.init(_capi.LinearCrossEntropySpec, "kjit_linear_cross_entropy_spec_init")
        _capi.fill(spec, "linear_cross_entropy()", dict(
            vocab=vocab, hidden=hidden, dtype=_choice("dtype", dtype, _capi.DTYPES),
            weight_grad_dtype=-1 if weight_grad_dtype is None else _choice(
                "weight_grad_dtype", weight_grad_dtype, _capi.DTYPES),
            bias=_capi.flag("bias", bias),
            weight_grad_accumulation=_choice("weight_grad_accumulation", weight_grad_accumulation,
                                             _capi.ACCUMULATIONS),
            config=_capi.c_string("config", config)))
        _fill_loss(spec.loss, "linear_cross_entropy()",
                   _loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap),
                   target_type=target_type, argmax=argmax, entropy=entropy,
                   class_weight_dtype=class_weight_dtype)
        op = LinearCrossEntropy(ctypes.c_void_p(), keep=self)
        self._call("kjit_linear_cross_entropy_create", self._handle, ctypes.byref(spec),
                   ctypes.byref(op._handle))
        return op

    def log_probs(self, vocab: int, dtype: str = "bf16", *, target_type: str = "int64",
                  ignore_index: int = -100, temperature: float = 1.0, entropy: bool = False,
                  config: Optional[str] = None) -> LogProbs:
        """Per-token log-probabilities (and entropy) of logits / temperature, for RL.
        config: None (the heuristic) or "vec=8 threads=256 unroll=4 cluster=0 staged=0"."""
        spec = _capi.init(_capi.LogProbsSpec, "kjit_log_probs_spec_init")
        _capi.fill(spec, "log_probs()", dict(
            vocab=vocab, dtype=_choice("dtype", dtype, _capi.DTYPES),
            target_type=_choice("target_type", target_type, _capi.INDEX_TYPES),
            ignore_index=ignore_index, temperature=temperature,
            entropy=_capi.flag("entropy", entropy), config=_capi.c_string("config", config)))
        op = LogProbs(ctypes.c_void_p(), keep=self)
        self._call("kjit_log_probs_create", self._handle, ctypes.byref(spec),
                   ctypes.byref(op._handle))
        return op

    def sharded_cross_entropy(self, vocab: int, shard_start: int, shard_end: int,
                              dtype: str = "bf16", *, target_type: str = "int64",
                              ignore_index: int = -100, reduction: str = "mean",
                              label_smoothing: float = 0.0, z_loss: float = 0.0,
                              softcap: Optional[float] = None, config: Optional[str] = None,
                              class_weight_dtype: Optional[str] = None) -> ShardedCrossEntropy:
        """The vocab-parallel cross-entropy of classes [shard_start, shard_end) of `vocab`;
        options as cross_entropy's (label smoothing over the whole vocab; class_weight_dtype
        makes the launches take the whole [vocab] weight vector). config: None (the heuristic)
        or "vec=8 threads=256 unroll=4 cluster=0 staged=0" (cluster must be 0)."""
        spec = _capi.init(_capi.ShardedCrossEntropySpec, "kjit_sharded_cross_entropy_spec_init")
        _capi.fill(spec, "sharded_cross_entropy()", dict(
            vocab=vocab, shard_start=shard_start, shard_end=shard_end,
            dtype=_choice("dtype", dtype, _capi.DTYPES), config=_capi.c_string("config", config)))
        _fill_loss(spec.loss, "sharded_cross_entropy()",
                   _loss_options(ignore_index, reduction, label_smoothing, z_loss, softcap),
                   target_type=target_type, argmax=False, entropy=False,
                   class_weight_dtype=class_weight_dtype)
        op = ShardedCrossEntropy(ctypes.c_void_p(), keep=self)
        self._call("kjit_sharded_cross_entropy_create", self._handle, ctypes.byref(spec),
                   ctypes.byref(op._handle))
        return op
