"""The ctypes binding of kjit's C API (include/kjit/kjit_c.h): struct layouts, prototypes, loading.

Everything above this module (kjit.Runtime, kjit.torch) goes through `call`, which turns a failed
status into a KjitError carrying the library's message. The library is libkjit_c.so from the
wheel's kjit/_native folder (its Abseil and fmt lie beside it), or $KJIT_C_LIBRARY.

    from kjit import _capi
    lib = _capi.lib()
    print(lib.kjit_abi_version())
"""

from __future__ import annotations

import ctypes
import glob
import operator
import os
import sys
import threading
from pathlib import Path
from typing import Optional

ABI_VERSION = 6  # KJIT_C_ABI_VERSION this binding was written for

NATIVE_DIR = Path(__file__).resolve().parent / "_native"

DTYPES = {"fp32": 0, "fp16": 1, "bf16": 2}
INDEX_TYPES = {"int32": 0, "int64": 1}
REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
CASTINGS = {"llama": 0, "gemma": 1, "none": 2}
ACCUMULATIONS = {"fp32": 0, "output_dtype": 1}


class KjitError(RuntimeError):
    """A kjit call failed; `status` is the C API's status name ("INVALID_ARGUMENT"...)."""

    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class KjitInvalidArgument(KjitError, ValueError):
    """An argument was bad; the message names it and says what was expected."""


class KjitUnavailable(KjitError):
    """No CUDA driver, GPU or NVRTC: the message says what is missing and how to fix it."""


_ERROR_TYPES = {"INVALID_ARGUMENT": KjitInvalidArgument, "UNAVAILABLE": KjitUnavailable}


def error(status: str, message: str) -> KjitError:
    return _ERROR_TYPES.get(status, KjitError)(status, message)


# ---- Structs, in the header's order -------------------------------------------------------------

class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("rows", ctypes.c_int64),
                ("cols", ctypes.c_int64), ("row_stride", ctypes.c_int64)]


class Index(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("type", ctypes.c_int32), ("size", ctypes.c_int64)]


WARNING_FN = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_void_p)


class RuntimeOptions(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("device", ctypes.c_int32),
                ("target", ctypes.c_char_p), ("compile_only", ctypes.c_int32),
                ("disk_cache", ctypes.c_int32), ("cache_dir", ctypes.c_char_p),
                ("tuning_db", ctypes.c_char_p), ("autotune", ctypes.c_int32),
                ("warning", WARNING_FN), ("warning_user_data", ctypes.c_void_p)]


class RmsNormSpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("hidden", ctypes.c_int64),
                ("dtype", ctypes.c_int32), ("weight_dtype", ctypes.c_int32),
                ("eps", ctypes.c_float), ("weight_offset", ctypes.c_float),
                ("casting", ctypes.c_int32), ("fused_residual", ctypes.c_int32),
                ("config", ctypes.c_char_p)]


class RmsNormForwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("x", Tensor), ("weight", Tensor), ("y", Tensor),
                ("rstd", Tensor), ("residual", Tensor), ("residual_out", Tensor)]


class RmsNormBackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("dy", Tensor), ("x", Tensor),
                ("weight", Tensor), ("rstd", Tensor), ("dx", Tensor), ("dw", Tensor),
                ("dresidual", Tensor), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64)]


class LossOptions(ctypes.Structure):
    """kjit_loss_options: embedded as `loss` in every loss op's spec."""
    _fields_ = [("target_type", ctypes.c_int32), ("reduction", ctypes.c_int32),
                ("ignore_index", ctypes.c_int64), ("label_smoothing", ctypes.c_float),
                ("z_loss", ctypes.c_float), ("softcap", ctypes.c_float),
                ("argmax", ctypes.c_int32), ("entropy", ctypes.c_int32),
                ("class_weight_dtype", ctypes.c_int32)]


class CrossEntropySpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("vocab", ctypes.c_int64),
                ("dtype", ctypes.c_int32), ("loss", LossOptions), ("config", ctypes.c_char_p)]


class CrossEntropyArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("logits", Tensor), ("targets", Index),
                ("loss", Tensor), ("lse", Tensor), ("argmax", Index), ("grad", Tensor),
                ("grad_output", Tensor), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64), ("class_weight", Tensor),
                ("entropy", Tensor), ("target_logprob", Tensor)]


class CrossEntropyBackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("logits", Tensor), ("targets", Index),
                ("lse", Tensor), ("grad_output", Tensor), ("grad", Tensor),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_int64),
                ("class_weight", Tensor)]


class CrossEntropyRescaleArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("grad", Tensor), ("grad_output", Tensor),
                ("applied", Tensor)]


class LinearCrossEntropySpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("vocab", ctypes.c_int64),
                ("hidden", ctypes.c_int64), ("dtype", ctypes.c_int32),
                ("weight_grad_dtype", ctypes.c_int32), ("bias", ctypes.c_int32),
                ("loss", LossOptions), ("weight_grad_accumulation", ctypes.c_int32),
                ("config", ctypes.c_char_p)]


class LinearCrossEntropyArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("hidden_states", Tensor), ("weight", Tensor),
                ("bias", Tensor), ("targets", Index), ("loss", Tensor), ("lse", Tensor),
                ("argmax", Index), ("grad_output", Tensor), ("d_hidden", Tensor),
                ("d_weight", Tensor), ("d_bias", Tensor), ("accumulate", ctypes.c_int32),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_int64),
                ("entropy", Tensor), ("target_logprob", Tensor), ("class_weight", Tensor)]


class LinearCrossEntropyRescaleArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("d_hidden", Tensor), ("d_weight", Tensor),
                ("d_bias", Tensor), ("grad_output", Tensor), ("applied", Tensor)]


class ShardedCrossEntropySpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("vocab", ctypes.c_int64),
                ("shard_start", ctypes.c_int64), ("shard_end", ctypes.c_int64),
                ("dtype", ctypes.c_int32), ("loss", LossOptions), ("config", ctypes.c_char_p)]


class ShardedCrossEntropyArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("logits", Tensor), ("targets", Index),
                ("loss", Tensor), ("lse", Tensor), ("grad", Tensor), ("grad_output", Tensor),
                ("class_weight", Tensor), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64)]


class LogProbsSpec(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("vocab", ctypes.c_int64),
                ("dtype", ctypes.c_int32), ("target_type", ctypes.c_int32),
                ("ignore_index", ctypes.c_int64), ("temperature", ctypes.c_float),
                ("entropy", ctypes.c_int32), ("config", ctypes.c_char_p)]


class LogProbsArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("logits", Tensor), ("targets", Index),
                ("logprob", Tensor), ("entropy", Tensor), ("lse", Tensor)]


class LogProbsBackwardArgs(ctypes.Structure):
    _fields_ = [("struct_size", ctypes.c_uint32), ("logits", Tensor), ("targets", Index),
                ("lse", Tensor), ("entropy", Tensor), ("grad_logprob", Tensor),
                ("grad_entropy", Tensor), ("grad", Tensor)]


class NamedTensor(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("tensor", Tensor)]


class NamedIndex(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("index", Index)]


class OpArgs(ctypes.Structure):
    """kjit_op_args: a launch's named arguments, for the ops by name (kjit_op_*)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("tensors", ctypes.POINTER(NamedTensor)),
                ("tensor_count", ctypes.c_int32), ("indexes", ctypes.POINTER(NamedIndex)),
                ("index_count", ctypes.c_int32), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_int64)]


# ---- Prototypes ---------------------------------------------------------------------------------

_H = ctypes.c_void_p  # every handle
_S = ctypes.c_int     # kjit_status
_OUT_STR = ctypes.POINTER(ctypes.c_void_p)
_I64P = ctypes.POINTER(ctypes.c_int64)
_STREAM = ctypes.c_void_p

_PROTOTYPES = {
    "kjit_abi_version": (ctypes.c_uint32, []),
    "kjit_version": (ctypes.c_char_p, []),
    "kjit_full_version": (_S, [_OUT_STR]),
    "kjit_last_error": (ctypes.c_char_p, []),
    "kjit_status_name": (ctypes.c_char_p, [_S]),
    "kjit_free": (None, [ctypes.c_void_p]),
    "kjit_runtime_options_init": (None, [ctypes.POINTER(RuntimeOptions)]),
    "kjit_runtime_create": (_S, [ctypes.POINTER(RuntimeOptions), ctypes.POINTER(_H)]),
    "kjit_runtime_destroy": (None, [_H]),
    "kjit_runtime_info": (_S, [_H, _OUT_STR]),
    "kjit_rms_norm_spec_init": (None, [ctypes.POINTER(RmsNormSpec)]),
    "kjit_rms_norm_forward_args_init": (None, [ctypes.POINTER(RmsNormForwardArgs)]),
    "kjit_rms_norm_backward_args_init": (None, [ctypes.POINTER(RmsNormBackwardArgs)]),
    "kjit_rms_norm_create": (_S, [_H, ctypes.POINTER(RmsNormSpec), ctypes.POINTER(_H)]),
    "kjit_rms_norm_destroy": (None, [_H]),
    "kjit_rms_norm_forward": (_S, [_H, _STREAM, ctypes.POINTER(RmsNormForwardArgs)]),
    "kjit_rms_norm_backward": (_S, [_H, _STREAM, ctypes.POINTER(RmsNormBackwardArgs)]),
    "kjit_rms_norm_backward_workspace_bytes": (_S, [_H, ctypes.c_int64, _I64P]),
    "kjit_rms_norm_config_for": (_S, [_H, ctypes.c_int64, _OUT_STR]),
    "kjit_rms_norm_build": (_S, [_H, _OUT_STR]),
    "kjit_cross_entropy_spec_init": (None, [ctypes.POINTER(CrossEntropySpec)]),
    "kjit_cross_entropy_args_init": (None, [ctypes.POINTER(CrossEntropyArgs)]),
    "kjit_cross_entropy_backward_args_init": (None, [ctypes.POINTER(CrossEntropyBackwardArgs)]),
    "kjit_cross_entropy_rescale_args_init": (None, [ctypes.POINTER(CrossEntropyRescaleArgs)]),
    "kjit_cross_entropy_create": (_S, [_H, ctypes.POINTER(CrossEntropySpec), ctypes.POINTER(_H)]),
    "kjit_cross_entropy_destroy": (None, [_H]),
    "kjit_cross_entropy_forward": (_S, [_H, _STREAM, ctypes.POINTER(CrossEntropyArgs)]),
    "kjit_cross_entropy_forward_backward": (_S, [_H, _STREAM, ctypes.POINTER(CrossEntropyArgs)]),
    "kjit_cross_entropy_backward": (_S, [_H, _STREAM, ctypes.POINTER(CrossEntropyBackwardArgs)]),
    "kjit_cross_entropy_rescale_gradient":
        (_S, [_H, _STREAM, ctypes.POINTER(CrossEntropyRescaleArgs)]),
    "kjit_cross_entropy_workspace_bytes": (_S, [_H, ctypes.c_int64, _I64P]),
    "kjit_cross_entropy_config_for": (_S, [_H, ctypes.c_int64, ctypes.c_int32, _OUT_STR]),
    "kjit_cross_entropy_build": (_S, [_H, _OUT_STR]),
    "kjit_linear_cross_entropy_spec_init": (None, [ctypes.POINTER(LinearCrossEntropySpec)]),
    "kjit_linear_cross_entropy_args_init": (None, [ctypes.POINTER(LinearCrossEntropyArgs)]),
    "kjit_linear_cross_entropy_rescale_args_init":
        (None, [ctypes.POINTER(LinearCrossEntropyRescaleArgs)]),
    "kjit_linear_cross_entropy_create":
        (_S, [_H, ctypes.POINTER(LinearCrossEntropySpec), ctypes.POINTER(_H)]),
    "kjit_linear_cross_entropy_destroy": (None, [_H]),
    "kjit_linear_cross_entropy_forward":
        (_S, [_H, _STREAM, ctypes.POINTER(LinearCrossEntropyArgs)]),
    "kjit_linear_cross_entropy_forward_backward":
        (_S, [_H, _STREAM, ctypes.POINTER(LinearCrossEntropyArgs)]),
    "kjit_linear_cross_entropy_rescale_gradients":
        (_S, [_H, _STREAM, ctypes.POINTER(LinearCrossEntropyRescaleArgs)]),
    "kjit_linear_cross_entropy_workspace_bytes": (_S, [_H, ctypes.c_int64, _I64P]),
    "kjit_linear_cross_entropy_accumulator_bytes": (_S, [_H, ctypes.c_int64, _I64P]),
    "kjit_linear_cross_entropy_config_for": (_S, [_H, ctypes.c_int64, _OUT_STR]),
    "kjit_linear_cross_entropy_build": (_S, [_H, _OUT_STR]),
    "kjit_sharded_cross_entropy_spec_init": (None, [ctypes.POINTER(ShardedCrossEntropySpec)]),
    "kjit_sharded_cross_entropy_args_init": (None, [ctypes.POINTER(ShardedCrossEntropyArgs)]),
    "kjit_sharded_cross_entropy_create":
        (_S, [_H, ctypes.POINTER(ShardedCrossEntropySpec), ctypes.POINTER(_H)]),
    "kjit_sharded_cross_entropy_destroy": (None, [_H]),
    "kjit_sharded_cross_entropy_compute_stats":
        (_S, [_H, _STREAM, ctypes.POINTER(ShardedCrossEntropyArgs)]),
    "kjit_sharded_cross_entropy_all_reduce_stats":
        (_S, [_H, _STREAM, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p]),
    "kjit_sharded_cross_entropy_stats_of":
        (_S, [_H, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
              ctypes.POINTER(ctypes.c_void_p)]),
    "kjit_sharded_cross_entropy_rescale_stats":
        (_S, [_H, _STREAM, ctypes.c_void_p, ctypes.c_int64]),
    "kjit_sharded_cross_entropy_combine_stats":
        (_S, [_STREAM, ctypes.POINTER(_H), ctypes.POINTER(ctypes.c_void_p), ctypes.c_int32,
              ctypes.c_int64]),
    "kjit_sharded_cross_entropy_finish":
        (_S, [_H, _STREAM, ctypes.POINTER(ShardedCrossEntropyArgs)]),
    "kjit_sharded_cross_entropy_run":
        (_S, [_H, _STREAM, ctypes.POINTER(ShardedCrossEntropyArgs), ctypes.c_void_p]),
    "kjit_sharded_cross_entropy_workspace_bytes": (_S, [_H, ctypes.c_int64, _I64P]),
    "kjit_sharded_cross_entropy_config": (_S, [_H, _OUT_STR]),
    "kjit_sharded_cross_entropy_build": (_S, [_H, _OUT_STR]),
    "kjit_log_probs_spec_init": (None, [ctypes.POINTER(LogProbsSpec)]),
    "kjit_log_probs_args_init": (None, [ctypes.POINTER(LogProbsArgs)]),
    "kjit_log_probs_backward_args_init": (None, [ctypes.POINTER(LogProbsBackwardArgs)]),
    "kjit_log_probs_create": (_S, [_H, ctypes.POINTER(LogProbsSpec), ctypes.POINTER(_H)]),
    "kjit_log_probs_destroy": (None, [_H]),
    "kjit_log_probs_forward": (_S, [_H, _STREAM, ctypes.POINTER(LogProbsArgs)]),
    "kjit_log_probs_backward": (_S, [_H, _STREAM, ctypes.POINTER(LogProbsBackwardArgs)]),
    "kjit_log_probs_config": (_S, [_H, _OUT_STR]),
    "kjit_log_probs_build": (_S, [_H, _OUT_STR]),
    "kjit_op_schema": (_S, [_OUT_STR]),
    "kjit_op_args_init": (None, [ctypes.POINTER(OpArgs)]),
    "kjit_op_create": (_S, [_H, ctypes.c_char_p, ctypes.POINTER(_H)]),
    "kjit_op_destroy": (None, [_H]),
    "kjit_op_spec": (_S, [_H, _OUT_STR]),
    "kjit_op_launch": (_S, [_H, ctypes.c_char_p, _STREAM, ctypes.POINTER(OpArgs)]),
    "kjit_op_workspace_bytes": (_S, [_H, ctypes.c_char_p, ctypes.c_int64, _I64P]),
    "kjit_op_config_for": (_S, [_H, ctypes.c_int64, _OUT_STR]),
    "kjit_op_build": (_S, [_H, _OUT_STR]),
}

_lib = None
_lib_lock = threading.Lock()


def library_path() -> Path:
    override = os.environ.get("KJIT_C_LIBRARY")
    return Path(override) if override else NATIVE_DIR / "libkjit_c.so"


def _find_pip_nvrtc() -> str | None:
    """libnvrtc from pip's nvidia-cuda-nvrtc wheel (nvidia/cuda_nvrtc/lib or nvidia/cu13/lib)."""
    for base in sys.path:
        for pattern in ("nvidia/cu13/lib/libnvrtc.so.13*", "nvidia/cuda_nvrtc/lib/libnvrtc.so.1*"):
            found = sorted(glob.glob(os.path.join(base, pattern)))
            if found:
                return found[0]
    return None


def _point_at_nvrtc() -> None:
    """Lets the C++ side find pip's libnvrtc when the system has none (it dlopens by name)."""
    if os.environ.get("KJIT_NVRTC_PATH"):
        return
    for name in ("libnvrtc.so.13", "libnvrtc.so.12", "/usr/local/cuda/lib64/libnvrtc.so"):
        try:
            ctypes.CDLL(name)
            return
        except OSError:
            pass
    found = _find_pip_nvrtc()
    if found:
        os.environ["KJIT_NVRTC_PATH"] = found


def _find_pip_cublaslt() -> str | None:
    """libcublasLt from pip's nvidia-cublas wheel (nvidia/cu13/lib or nvidia/cublas/lib), which
    the linear + cross-entropy op's GEMMs use."""
    for base in sys.path:
        for pattern in ("nvidia/cu13/lib/libcublasLt.so.13*",
                        "nvidia/cublas/lib/libcublasLt.so.1*"):
            found = sorted(glob.glob(os.path.join(base, pattern)))
            if found:
                return found[0]
    return None


def _point_at_cublaslt() -> None:
    """Lets the C++ side find pip's libcublasLt when the system has none (it dlopens by name; a
    copy torch already loaded answers to its name)."""
    if os.environ.get("KJIT_CUBLASLT_PATH"):
        return
    for name in ("libcublasLt.so.13", "libcublasLt.so.12", "/usr/local/cuda/lib64/libcublasLt.so"):
        try:
            ctypes.CDLL(name)
            return
        except OSError:
            pass
    found = _find_pip_cublaslt()
    if found:
        os.environ["KJIT_CUBLASLT_PATH"] = found


def lib() -> ctypes.CDLL:
    """The loaded C library (loaded once, ABI checked)."""
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not path.exists():
            raise ImportError(f"kjit: the native library {path} is missing; reinstall the kjit "
                              "wheel (`pip install .` in a kjit checkout builds one) or set "
                              "KJIT_C_LIBRARY to a libkjit_c.so")
        _point_at_nvrtc()
        _point_at_cublaslt()
        tune = NATIVE_DIR / "kjit-tune"
        if "KJIT_TUNE_BIN" not in os.environ and tune.exists():
            os.environ["KJIT_TUNE_BIN"] = str(tune)
        try:
            loaded = ctypes.CDLL(str(path))
        except OSError as e:
            raise ImportError(f"kjit: cannot load {path}: {e}; reinstall the kjit wheel or set "
                              "KJIT_C_LIBRARY to a libkjit_c.so") from None
        for name, (restype, argtypes) in _PROTOTYPES.items():
            fn = getattr(loaded, name, None)
            if fn is None:
                raise ImportError(f"kjit: {path} is not kjit's C library (it has no {name}); "
                                  "set KJIT_C_LIBRARY to a libkjit_c.so, or unset it")
            fn.restype = restype
            fn.argtypes = argtypes
        got = loaded.kjit_abi_version()
        if got != ABI_VERSION:
            raise ImportError(f"kjit: {path} has C ABI version {got}; this Python package needs "
                              f"{ABI_VERSION}: reinstall the wheel so both come from one build")
        _lib = loaded
        return _lib


class WarningSink:
    """The runtime's warning callback for the C library: calls `sink` with each message. ctypes can
    only print and drop what a callback raises ("Exception ignored on calling ctypes callback"),
    so an exception from `sink` (a warnings.warn under `-W error`) is kept here, and the call that
    caused it raises it once the library returns (`call(..., sink=...)`)."""

    def __init__(self, sink):
        self._sink = sink
        self._lock = threading.Lock()
        self._raised = []
        self.callback = WARNING_FN(self._on_warning)

    def _on_warning(self, message, _user_data) -> None:
        try:
            self._sink(message.decode("utf-8", "replace"))
        except BaseException as e:  # noqa: B036 -- handed to the caller, not swallowed
            with self._lock:
                self._raised.append(e)

    def raise_pending(self, cause: Optional[BaseException] = None) -> None:
        """Raises the first exception the sink raised since the last call (the rest are of the
        same call: dropped), chained to `cause`, the call's own failure if any."""
        with self._lock:
            raised, self._raised = self._raised, []
        if raised:
            raise raised[0] from cause


def call(name: str, *args, sink: Optional[WarningSink] = None) -> None:
    """Calls a kjit_* function that returns a status; raises KjitError unless it is KJIT_OK, or
    what `sink` raised for a warning of the call."""
    library = lib()
    status = getattr(library, name)(*args)
    failed = None
    if status != 0:
        message = library.kjit_last_error().decode("utf-8", "replace")
        failed = error(library.kjit_status_name(status).decode() or str(status), message)
    if sink is not None:
        sink.raise_pending(failed)
    if failed is not None:
        raise failed


def call_string(name: str, *args, sink: Optional[WarningSink] = None) -> str:
    """Calls a kjit_* function whose last argument is a char** out; returns that string."""
    out = ctypes.c_void_p()
    try:
        call(name, *args, ctypes.byref(out), sink=sink)
        return ctypes.string_at(out.value).decode("utf-8", "replace")
    finally:
        lib().kjit_free(out)


def call_int64(name: str, *args, sink: Optional[WarningSink] = None) -> int:
    out = ctypes.c_int64()
    call(name, *args, ctypes.byref(out), sink=sink)
    return out.value


def init(struct_type, init_function: str):
    """A struct set to the library's defaults by its *_init function."""
    value = struct_type()
    getattr(lib(), init_function)(ctypes.byref(value))
    return value


# ---- Checked conversions: ctypes wraps an int that does not fit, cuts a string at a NUL and takes
# any attribute name on a struct, all silently ---------------------------------------------------

_INTEGER_TYPES = (ctypes.c_int32, ctypes.c_int64, ctypes.c_uint32, ctypes.c_void_p)
# What a field of each other type takes, for messages: a view's maker, a number.
_EXPECTED = {Tensor: "a kjit.tensor() (or None)", Index: "a kjit.index() (or None)",
             ctypes.c_float: "a number (float)", ctypes.c_double: "a number (float)"}
QUOTED_CHARS = 60  # of a value an error quotes


def quoted(value) -> str:
    """What the caller gave, for an error message: its type and repr, cut to QUOTED_CHARS."""
    text = repr(value)
    if len(text) > QUOTED_CHARS:
        text = f"{text[:QUOTED_CHARS]}... ({len(text)} characters)"
    return f"{type(value).__name__} {text}"


def integer(name: str, value, ctype=ctypes.c_int64) -> int:
    """`value` as an int that `ctype` holds: TypeError for a non-integer, OverflowError naming
    `name` for one out of the type's range (2**64 + 4096 is not 4096)."""
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an int, got {quoted(value)}") from None
    bits = 8 * ctypes.sizeof(ctype)
    signed = ctype not in (ctypes.c_uint32, ctypes.c_void_p)
    low, high = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    if not low <= value <= high:
        raise OverflowError(f"{name}: {value} is out of range: expected {low} to {high}")
    return value


def c_string(name: str, value, *, path: bool = False) -> Optional[bytes]:
    """`value` as a C string, None as NULL. A path may be a str, bytes or os.PathLike (encoded as
    the file system does, os.fsencode); other text is a str. A NUL would end the string early:
    ValueError naming `name`."""
    if value is None:
        return None
    if path:
        if not isinstance(value, (str, bytes, os.PathLike)):
            raise TypeError(f"{name}: expected a str, bytes or os.PathLike path, got "
                            f"{type(value).__name__}")
        data = os.fsencode(value)
    elif isinstance(value, str):
        try:
            data = value.encode()
        except UnicodeEncodeError:  # a lone surrogate: "\udcff"
            raise ValueError(f"{name}: {value!r} is not text that UTF-8 can encode") from None
    else:
        raise TypeError(f"{name}: expected a str, got {type(value).__name__}")
    if b"\0" in data:
        raise ValueError(f"{name}: {value!r} contains a NUL character")
    return data


def pointer(name: str, value) -> int:
    """A device address or an opaque handle (a workspace, an ncclComm_t) as an int: None and 0
    are refused here, naming the argument, as the library would; anything else ctypes would
    pass (a str's bytes, a wrapped -1) is a TypeError or OverflowError naming it."""
    if value is None:
        raise TypeError(f"{name}: expected an address (an int), got None")
    return integer(name, value, ctypes.c_void_p)


def stream(value) -> Optional[int]:
    """A launch's stream: None (the legacy default stream) or a CUstream handle as an int, e.g.
    torch.cuda.current_stream().cuda_stream. ctypes would pass a str's bytes as the handle, wrap
    -1 and 2**64, and name no argument for a float."""
    return None if value is None else integer("stream", value, ctypes.c_void_p)


def flag(name: str, value) -> int:
    """A yes/no argument as the C API's 0 or 1: a bool (numpy's too), or the int 0 or 1; anything
    else (None, "yes", 2) raises TypeError or ValueError naming `name`, rather than being read as
    true or false."""
    if isinstance(value, bool) or getattr(getattr(value, "dtype", None), "kind", None) == "b":
        return int(bool(value))  # numpy's bool_ too, which has no __index__
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected a bool, got {type(value).__name__}") from None
    if number not in (0, 1):
        raise ValueError(f"{name}: expected a bool (or 0 or 1), got {number}")
    return number


def fill(struct, what: str, fields: dict):
    """Sets `fields` on a ctypes struct and returns it. A name the struct does not have raises
    TypeError naming it (`what` names the call), an integer its field cannot hold OverflowError,
    a value of the wrong type TypeError naming the field; None for a view leaves it empty."""
    types = {name: ctype for name, ctype in type(struct)._fields_ if name != "struct_size"}
    unknown = [name for name in fields if name not in types]
    if unknown:
        raise TypeError(f"{what}: unexpected keyword argument{'s' if len(unknown) > 1 else ''} "
                        f"{', '.join(map(repr, unknown))}; it takes {', '.join(types)}")
    for name, value in fields.items():
        if value is None and types[name] in (Tensor, Index):
            continue  # an empty view, as the struct starts: the argument not given
        if types[name] in _INTEGER_TYPES and value is not None:
            value = integer(name, value, types[name])
        try:
            setattr(struct, name, value)
        except TypeError:  # ctypes names neither the field nor what to pass
            expected = _EXPECTED.get(types[name], "an int")
            raise TypeError(f"{what}: {name}: expected {expected}, got {quoted(value)}") from None
    return struct
