"""A seeded fuzzer over the Python package's keyword arguments and values (issue 34, "Beyond the
list"), without a GPU: a compile-only runtime, its ops, their queries and launches (each launch
refused once its arguments are checked), kjit.tensor and kjit.index, called with random subsets of
their own keywords, misspelled ones, and values of every kind.

Whatever the call, it returns or raises TypeError, ValueError, OverflowError or a KjitError: never
another exception (AttributeError, ctypes.ArgumentError, UnicodeError, SystemError...), never a
crash, and afterwards the package still works. KJIT_FUZZ_CALLS sets how many calls (default 1500,
about two seconds); KJIT_FUZZ_SEED another seed. A failure prints the seed and the call."""

import ctypes
import inspect
import math
import os
import pathlib
import random

import pytest

import kjit
from kjit import _capi

CALLS = int(os.environ.get("KJIT_FUZZ_CALLS", "1500"))
SEED = int(os.environ.get("KJIT_FUZZ_SEED", "34"))

# What a call may raise: the documented errors for a bad argument, and the library's own.
ALLOWED = (TypeError, ValueError, OverflowError, kjit.KjitError)
# ValueError's subclasses that say nothing about the argument.
FORBIDDEN = (UnicodeError,)
# Messages of Python's and ctypes' own that name neither the argument nor what it takes.
ANONYMOUS = ("expected Tensor instance", "expected Index instance", "incompatible types",
             "cannot be interpreted as an integer", "invalid literal for int()")


def _pools(tmp_path: pathlib.Path):
    """Every kind of value, by kind, the valid ones included so that calls get past the first
    check. "any" holds them all."""
    pools = {
        "int": [0, 1, -1, 2, 8, 64, 1000, 4096, 128256, 2**31 - 1, 2**31, 2**32 + 64, 2**63 - 1,
                2**63, -2**63, -2**63 - 1, 2**64 + 4096, 10**30, -100],
        "bool": [True, False, 0, 1, 2, -1, None, "yes", 1.0],
        "float": [0.0, -0.0, 1e-6, 0.1, 0.5, 1.0, 30.0, -1.0, math.inf, -math.inf, math.nan, 1e300,
                  2**64, 1],
        "str": ["bf16", "fp16", "fp32", "int32", "int64", "mean", "sum", "none", "llama",
                "gemma", "output_dtype", "sm_90", "sm_80", "sm_75", "compute_90", "sm_100a",
                "sm_9999", "", " ", "\0", "bf16\0", "sm_90\0x", "\u00e9", "\udcff", "x" * 300,
                "vec=8 fwd=256x1 bwd=512x1r2", "vec=8 threads=256 unroll=4 cluster=6 staged=1",
                "chunk=1024 whole=0 streams=1 logits_algo=0 d_hidden_algo=0 d_weight_algo=0",
                "vec=", "=", "vec=8 vec=8", "off", None],
        "path": [tmp_path / "cache", str(tmp_path / "db.json"), bytes(tmp_path / "b"),
                 tmp_path / "caf\udce9", b"\xff\xfe", str(tmp_path / "nul\0"), "off", None, ""],
        "other": [None, object(), [], {}, (1, 2), b"bf16", bytearray(b"x"), 1 + 2j, print,
                  ctypes.c_int64(3), kjit, lambda *a, **k: None],
    }
    pools["any"] = [v for pool in pools.values() for v in pool]
    return pools


# The kind of each keyword, where its default does not say (None defaults).
KINDS = {"cache_dir": "path", "tuning_db": "path", "target": "str", "config": "str",
         "weight_dtype": "str", "class_weight_dtype": "str", "weight_grad_dtype": "str",
         "row_stride": "int", "warnings": "other", "workspace": "int", "workspace_bytes": "int",
         "accumulate": "bool", "data": "int", "rows": "int", "cols": "int", "size": "int", "n": "int",
         "hidden": "int", "vocab": "int", "device": "int"}


def _kind(name, default):
    if name in KINDS:
        return KINDS[name]
    for kind, types in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if isinstance(default, types):
            return kind
    return "any"


def _tensors(rng):
    dtypes = list(_capi.DTYPES)
    return [kjit.tensor(rng.choice([0, 16, 4096, 2**40]), rng.choice(dtypes), rng.choice([0, 1, 8]),
                        rng.choice([1, 64, 128256]), rng.choice([None, 64, 128256]))
            for _ in range(6)] + [kjit.index(0, "int64", 8), kjit.index(16, "int32", 1)]


def _kwargs(rng, params, pools, tensors=()):
    """A random subset of `params` ((name, default) pairs; a misspelling or an unknown name now and
    then), each given a value of its kind mostly, of any kind sometimes."""
    chosen = [(n, d) for n, d in params if rng.random() < 0.5]
    if rng.random() < 0.05:
        chosen.append((rng.choice(["bogus", "grad_ouput", "Hidden", "dtype_", "x" * 40, "", "é"]),
                       None))
    out = {}
    for name, default in chosen:
        if tensors and default is _TENSOR and rng.random() < 0.8:
            out[name] = rng.choice(tensors)
        else:
            kind = _kind(name, default) if rng.random() < 0.85 else "any"
            out[name] = rng.choice(pools[kind])
    return out


_TENSOR = object()  # the default of a launch's view fields


def _signature(fn):
    return [(p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in inspect.signature(fn).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD]


def _launch_fields(method):
    """The args struct a launch method fills: its fields are the keywords it takes, as
    (name, default) with the views' default _TENSOR."""
    c_function = method.__self__._destroy[:-len("destroy")] + method.__name__
    struct = _capi._PROTOTYPES[c_function][1][-1]._type_  # POINTER(args struct)
    return [(name, _TENSOR if ctype in (_capi.Tensor, _capi.Index) else None)
            for name, ctype in struct._fields_ if name != "struct_size"]


def _call(what, fn, args, kwargs, seed):
    try:
        fn(*args, **kwargs)
    except FORBIDDEN as e:
        pytest.fail(f"seed {seed}: {what}(*{args!r}, **{kwargs!r}) raised {e!r}")
    except ALLOWED as e:
        if any(a in str(e) for a in ANONYMOUS):
            pytest.fail(f"seed {seed}: {what}(*{args!r}, **{kwargs!r}) raised {e!r}, naming no "
                        "argument")
    except Exception as e:  # anything else is the defect this fuzzer looks for
        pytest.fail(f"seed {seed}: {what}(*{args!r}, **{kwargs!r}) raised {type(e).__name__}: "
                    f"{e}")


def test_random_keywords_and_values_raise_only_documented_errors(cache_dir, tmp_path):
    rng = random.Random(SEED)
    pools = _pools(tmp_path)
    rt = kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")
    ops = [rt.rms_norm(64), rt.rms_norm(4096, fused_residual=True),
           rt.cross_entropy(vocab=1000), rt.cross_entropy(vocab=64, class_weight_dtype="fp32"),
           rt.linear_cross_entropy(vocab=64, hidden=32)]
    makers = [("Runtime", kjit.Runtime), ("rt.rms_norm", rt.rms_norm),
              ("rt.cross_entropy", rt.cross_entropy),
              ("rt.linear_cross_entropy", rt.linear_cross_entropy), ("kjit.tensor", kjit.tensor),
              ("kjit.index", kjit.index), ("kjit.vector", kjit.vector)]
    methods = [(f"{type(op).__name__}.{name}", getattr(op, name)) for op in ops
               for name in dir(op) if not name.startswith("_") and callable(getattr(op, name))
               and name != "build"]  # build compiles: once, below
    assert len(methods) == 2 * 4 + 2 * 6 + 6  # queries and launches of the five ops
    for i in range(CALLS):
        seed = (SEED, i)
        if rng.random() < 0.4:
            what, fn = rng.choice(makers)
            params = _signature(fn)
            kwargs = _kwargs(rng, params, pools)
            if what == "Runtime" and rng.random() < 0.8:  # compile-only mostly: no driver here
                kwargs.setdefault("compile_only", True)
                kwargs.setdefault("target", "sm_90")
                kwargs.setdefault("tuning_db", "off")
            # The first arguments positionally now and then.
            names = [n for n, _ in params]
            positional = []
            for n in names[:rng.randrange(3)]:
                if n not in kwargs:
                    break
                positional.append(kwargs.pop(n))
            _call(what, fn, positional, kwargs, seed)
        else:
            what, fn = rng.choice(methods)
            params = _signature(fn)
            if params and params[0][0] == "stream":  # a launch: the stream, then struct fields
                kwargs = _kwargs(rng, _launch_fields(fn), pools, _tensors(rng))
                _call(what, fn, [rng.choice([None, 0, 2, 2**63, -1, 2**64, "s", b"s", 1.5, object()])],
                      kwargs, seed)
            else:
                _call(what, fn, [], _kwargs(rng, params, pools), seed)
    # Nothing the calls did broke the package: a build compiles and the queries answer.
    built = rt.rms_norm(128, "fp32").build()
    assert built["origin"] == "compiled"
    assert ops[2].workspace_bytes(16) >= 0
