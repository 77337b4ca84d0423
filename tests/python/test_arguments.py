"""What the package does with arguments ctypes would take silently (issue 34): misspelled keyword
arguments, integers beyond their C type, paths that are not str, strings with a NUL. All without a
GPU: the ops are created compile-only, and each check comes before the launch is refused."""

import inspect
import os
import pathlib

import pytest

import kjit


@pytest.fixture
def rt(cache_dir):
    return kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off")


def _launches(rt):
    """(name, bound method) of every op's launches: the methods that take **fields."""
    ops = [rt.rms_norm(64), rt.cross_entropy(vocab=64),
           rt.linear_cross_entropy(vocab=64, hidden=32)]
    return [(f"{type(op).__name__}.{name}", getattr(op, name))
            for op in ops for name in dir(op) if not name.startswith("_")
            and callable(getattr(op, name)) and any(
                p.kind is inspect.Parameter.VAR_KEYWORD
                for p in inspect.signature(getattr(op, name)).parameters.values())]


def test_the_launches_are_found(rt):
    assert len(_launches(rt)) == 9  # RmsNorm 2, CrossEntropy 4, LinearCrossEntropy 3


# Issue 34 (3): ctypes structures take unknown names as plain attributes, so
# forward_backward(grad_ouput=g) ran without the upstream gradient.
@pytest.mark.parametrize("misspelled", [dict(grad_ouput=None), dict(bogus=1),
                                        dict(bogus=1, grad_ouput=None)])
def test_an_unknown_keyword_argument_of_a_launch_is_a_type_error(rt, misspelled):
    for name, launch in _launches(rt):
        with pytest.raises(TypeError) as e:
            launch(None, **misspelled)
        message = str(e.value)
        assert message.startswith(f"{name}(): unexpected keyword argument"), message
        for key in misspelled:
            assert repr(key) in message, message
        assert "it takes " in message  # and lists the names it takes
    with pytest.raises(TypeError, match=r"tensor: unexpected keyword argument 'stride'"):
        kjit._capi.fill(kjit._capi.Tensor(), "tensor", dict(stride=4))


# Issue 34 (7): ctypes wraps an int that does not fit its C type: rms_norm(2**64 + 4096) built
# hidden 4096.
@pytest.mark.parametrize("call, name", [
    (lambda rt: rt.rms_norm(2**64 + 4096), "hidden"),
    (lambda rt: rt.cross_entropy(vocab=2**64 + 5), "vocab"),
    (lambda rt: rt.cross_entropy(vocab=64, ignore_index=2**63), "ignore_index"),
    (lambda rt: rt.linear_cross_entropy(vocab=64, hidden=-2**63 - 1), "hidden"),
    (lambda rt: rt.rms_norm(64).config_for(2**64 + 5), "rows"),
    (lambda rt: rt.rms_norm(64).backward_workspace_bytes(2**64 + 3), "rows"),
    (lambda rt: rt.cross_entropy(vocab=64).workspace_bytes(2**64 + 3), "rows"),
    (lambda rt: rt.cross_entropy(vocab=64).config_for(2**64 + 3), "rows"),
    (lambda rt: rt.linear_cross_entropy(vocab=64, hidden=32).accumulator_bytes(2**64), "rows"),
    (lambda rt: kjit.tensor(0x1000, "bf16", 2**64 + 3, 64), "rows"),
    (lambda rt: kjit.tensor(2**64 + 0x1000, "bf16", 1, 64), "data"),
    (lambda rt: kjit.index(0x1000, "int64", 2**64 + 1), "size"),
    (lambda rt: rt.cross_entropy(vocab=64).forward(None, workspace_bytes=2**64), "workspace_bytes"),
    (lambda rt: kjit.Runtime(2**32, target="sm_90", compile_only=True), "device"),
])
def test_an_integer_its_c_type_cannot_hold_is_an_overflow_error(rt, call, name):
    with pytest.raises(OverflowError, match=f"^{name}: -?[0-9]+ is out of range: expected "):
        call(rt)


def test_integers_at_their_c_types_limits_pass(rt):
    assert rt.cross_entropy(vocab=64, ignore_index=-2**63).build()["params"]["vocab"] == "64"
    assert kjit.tensor(2**64 - 1, "bf16", 2**63 - 1, 1).rows == 2**63 - 1
    with pytest.raises(TypeError):
        rt.rms_norm(64.0)


# Issue 34 (8): a pathlib.Path raised AttributeError (no .encode), a non-UTF-8 path
# UnicodeEncodeError, and a NUL cut the string short.
def test_paths_may_be_path_like_or_bytes(cache_dir, tmp_path):
    as_path = tmp_path / "as_path"
    built = kjit.Runtime(target="sm_90", compile_only=True, cache_dir=as_path,
                         tuning_db=tmp_path / "no-such-db.json").rms_norm(64).build()
    assert pathlib.Path(built["path"]).parent == as_path
    raw = os.fsencode(tmp_path) + b"/not-utf8-\xff"
    kjit.Runtime(target="sm_90", compile_only=True, cache_dir=raw).rms_norm(64).build()
    assert any(name.endswith(b".kjit") for name in os.listdir(raw))
    as_str = os.fsdecode(os.fsencode(tmp_path) + b"/not-utf8-\xfe")  # surrogate escapes
    kjit.Runtime(target="sm_90", compile_only=True, cache_dir=as_str).rms_norm(64).build()
    assert any(name.endswith(".kjit") for name in os.listdir(as_str))
    with pytest.raises(TypeError):
        kjit.Runtime(target="sm_90", compile_only=True, cache_dir=42)


@pytest.mark.parametrize("call, name", [
    (lambda tmp: kjit.Runtime(target="sm_90\0x", compile_only=True), "target"),
    (lambda tmp: kjit.Runtime(target="sm_90", compile_only=True, cache_dir=f"{tmp}/a\0b"),
     "cache_dir"),
    (lambda tmp: kjit.Runtime(target="sm_90", compile_only=True, tuning_db=b"off\0"),
     "tuning_db"),
    (lambda tmp: kjit.Runtime(target="sm_90", compile_only=True, tuning_db="off").rms_norm(
        64, config="vec=8 fwd=4x32 bwd=8x16\0vec=2"), "config"),
])
def test_a_nul_in_a_string_is_a_value_error(cache_dir, tmp_path, call, name):
    with pytest.raises(ValueError, match=f"^{name}: .* contains a NUL character"):
        call(tmp_path)


# Found by tests/python/test_fuzz_arguments.py: errors that named no argument, or values read as
# something else.
@pytest.mark.parametrize("call, error, message", [
    # UnicodeEncodeError, naming nothing.
    (lambda rt: kjit.Runtime(target="\udcff", compile_only=True), ValueError,
     "target: '\\udcff' is not text that UTF-8 can encode"),
    (lambda rt: rt.rms_norm(64, config="\udcff"), ValueError, "config: "),
    # int("yes") raised "invalid literal for int()"; None "int() argument must be..."; "1" and 1.0
    # were true.
    (lambda rt: kjit.Runtime(target="sm_90", compile_only="yes"), TypeError,
     "compile_only: expected a bool, got str"),
    (lambda rt: kjit.Runtime(target="sm_90", compile_only=True, disk_cache=None), TypeError,
     "disk_cache: expected a bool, got NoneType"),
    (lambda rt: rt.rms_norm(64, fused_residual=2), ValueError,
     "fused_residual: expected a bool (or 0 or 1), got 2"),
    (lambda rt: rt.cross_entropy(vocab=64, argmax=1.0), TypeError, "argmax: expected a bool"),
    (lambda rt: rt.cross_entropy(vocab=64).config_for(16, fused="no"), TypeError,
     "fused: expected a bool"),
    # Accepted: the first warning then failed, inside the library's callback.
    (lambda rt: kjit.Runtime(target="sm_90", compile_only=True, warnings="log"), TypeError,
     "warnings: expected a callable"),
    # ctypes' "expected Tensor instance, got int" and "... cannot be interpreted as an integer".
    (lambda rt: rt.rms_norm(64).forward(None, x=3), TypeError,
     "RmsNorm.forward(): x: expected a kjit.tensor() (or None), got int"),
    (lambda rt: rt.cross_entropy(vocab=64).forward(None, targets=kjit.tensor(0, "fp32", 1, 1)),
     TypeError, "CrossEntropy.forward(): targets: expected a kjit.index() (or None), got Tensor"),
    (lambda rt: rt.rms_norm(64).config_for("16"), TypeError, "rows: expected an int, got str"),
    (lambda rt: kjit.tensor("0x10", "bf16", 1, 1), TypeError, "data: expected an int, got str"),
    # A launch's stream: a str was passed as a pointer to its bytes, -1 and 2**64 wrapped, and a
    # float raised ctypes.ArgumentError ("argument 2: TypeError: wrong type").
    (lambda rt: rt.rms_norm(64).forward("stream"), TypeError, "stream: expected an int, got str"),
    (lambda rt: rt.rms_norm(64).forward(-1), OverflowError, "stream: -1 is out of range"),
    (lambda rt: rt.cross_entropy(vocab=64).forward_backward(2**64), OverflowError,
     "stream: 18446744073709551616 is out of range"),
    (lambda rt: rt.linear_cross_entropy(vocab=64, hidden=32).forward(1.5), TypeError,
     "stream: expected an int, got float"),
])
def test_bad_values_are_errors_that_name_the_argument(rt, call, error, message):
    with pytest.raises(error) as e:
        call(rt)
    assert str(e.value).startswith(message), str(e.value)


def test_none_leaves_an_optional_view_empty(rt):
    # Launches check what they were given before refusing a compile-only runtime: None for lse is
    # no lse, so the refusal is about the launch, not about lse.
    op = rt.cross_entropy(vocab=64)
    with pytest.raises(kjit.KjitError) as e:
        op.forward(None, logits=kjit.tensor(16, "bf16", 2, 64), targets=kjit.index(16, "int64", 2),
                   loss=kjit.tensor(16, "fp32", 1, 1), lse=None)
    assert "lse" not in str(e.value), str(e.value)


class _NumpyBool:
    """numpy.bool_'s shape without numpy: a dtype of kind "b", __bool__, and no __index__."""

    dtype = type("dtype", (), {"kind": "b"})()

    def __init__(self, value: bool):
        self.value = value

    def __bool__(self):
        return self.value


def test_numpy_bools_are_flags(rt):
    # int() took them before flags were checked; operator.index() alone would refuse them.
    assert kjit._capi.flag("argmax", _NumpyBool(True)) == 1
    assert kjit._capi.flag("argmax", _NumpyBool(False)) == 0
    rt.cross_entropy(vocab=64, argmax=_NumpyBool(True))


# ---- The vocab-parallel cross-entropy (issue 37) ----------------------------------------------

@pytest.fixture
def sharded(rt):
    """The second of two shards of a 64-class vocab, compile-only."""
    return rt.sharded_cross_entropy(vocab=64, shard_start=32, shard_end=64)


def test_sharded_launches_refuse_unknown_keyword_arguments(sharded):
    for name, launch in (("compute_stats", sharded.compute_stats),
                         ("finish", sharded.finish),
                         ("run", lambda stream, **f: sharded.run(stream, 0x1000, **f))):
        with pytest.raises(TypeError, match=rf"^ShardedCrossEntropy\.{name}\(\): unexpected "
                                            r"keyword argument 'grad_ouput'; it takes logits, "):
            launch(None, grad_ouput=None)


@pytest.mark.parametrize("call, name", [
    (lambda rt, op: rt.sharded_cross_entropy(vocab=2**64 + 5, shard_start=0, shard_end=5),
     "vocab"),
    (lambda rt, op: rt.sharded_cross_entropy(vocab=64, shard_start=2**63, shard_end=64),
     "shard_start"),
    (lambda rt, op: op.workspace_bytes(2**64 + 3), "rows"),
    (lambda rt, op: op.stats_of(2**64 + 0x1000, 4), "workspace"),
    (lambda rt, op: op.stats_of(0x1000, 2**63), "rows"),
    (lambda rt, op: op.rescale_stats(None, 0x1000, -2**63 - 1), "rows"),
    (lambda rt, op: op.all_reduce_stats(None, 0x1000, 4, 2**64), "nccl_comm"),
    (lambda rt, op: op.run(None, -1), "nccl_comm"),
    (lambda rt, op: kjit.combine_stats(None, [(op, 2**64)], 4), r"shards\[0\] workspace"),
])
def test_sharded_integers_their_c_types_cannot_hold_are_overflow_errors(rt, sharded, call, name):
    with pytest.raises(OverflowError, match=f"^{name}: -?[0-9]+ is out of range: expected "):
        call(rt, sharded)


@pytest.mark.parametrize("call, error, message", [
    (lambda op: op.run(None, None), TypeError, "nccl_comm: expected an address"),
    (lambda op: op.all_reduce_stats(None, None, 4, 0x1000), TypeError,
     "workspace: expected an address"),
    (lambda op: op.all_reduce_stats(None, 0x1000, 4, "comm"), TypeError,
     "nccl_comm: expected an int, got str"),
    (lambda op: kjit.combine_stats(None, [op], 4), TypeError,
     r"shards\[0\]: expected an \(op, workspace\) pair"),
    (lambda op: kjit.combine_stats(None, [("op", 0x1000)], 4), TypeError,
     r"shards\[0\]: expected a ShardedCrossEntropy op, got str"),
    (lambda op: op.stats_of(0, 4), kjit.KjitInvalidArgument,
     "kjit_sharded_cross_entropy_stats_of: workspace is NULL"),
    (lambda op: kjit.combine_stats(None, [(op, 0x1000)], 4), kjit.KjitInvalidArgument,
     r"shards: cover classes \[32, 64\)|shards\[0\]: classes \[32, 64\)"),
    (lambda op: kjit.combine_stats(None, [], 4), kjit.KjitInvalidArgument, "count: 0 shards"),
])
def test_sharded_bad_values_name_the_argument(sharded, call, error, message):
    with pytest.raises(error, match=message):
        call(sharded)


def test_sharded_specs_are_checked_by_the_library(rt):
    with pytest.raises(kjit.KjitInvalidArgument, match="^shard_end: 65 must be above"):
        rt.sharded_cross_entropy(vocab=64, shard_start=0, shard_end=65)
    with pytest.raises(ValueError, match="^reduction: expected one of"):
        rt.sharded_cross_entropy(vocab=64, shard_start=0, shard_end=32, reduction="avg")
    with pytest.raises(TypeError, match="^vocab: expected an int, got float"):
        rt.sharded_cross_entropy(vocab=64.0, shard_start=0, shard_end=32)


def test_sharded_queries_and_compile_only_launches(sharded):
    rows = 4
    nbytes = sharded.workspace_bytes(rows)
    assert nbytes >= rows * 5 * 4 and nbytes % 16 == 0
    base = 0x10000
    max_at, sums_at = sharded.stats_of(base, rows)
    assert sums_at - max_at == rows * 4  # rows floats of max, then the 3 * rows sums
    assert base <= max_at and sums_at + 3 * rows * 4 <= base + nbytes
    assert "cluster=0" in sharded.config()
    assert sharded.build()["params"]["width"] == "32"
    with pytest.raises(kjit.KjitError, match="compile-only") as e:
        sharded.rescale_stats(None, base, rows)
    assert e.value.status == "FAILED_PRECONDITION"


# Issue 45, defect 12: label_smoothing="0.1" said "expected an int"; a long value was echoed whole.
@pytest.mark.parametrize("options, message", [
    (dict(label_smoothing="0.1"), r"label_smoothing: expected a number \(float\), got str '0\.1'$"),
    (dict(z_loss=[1]), r"z_loss: expected a number \(float\), got list \[1\]$"),
    (dict(ignore_index="x" * 5000),
     r"ignore_index: expected an int, got str 'x{59}\.\.\. \(5002 characters\)$"),
    (dict(reduction="mean" * 5000), r"reduction: expected one of 'none', 'sum', 'mean', got str "
                                    r"'(mean){14}mea\.\.\. \(20002 characters\)$"),
])
def test_a_loss_option_of_the_wrong_type_names_the_type_and_quotes_the_value(rt, options,
                                                                               message):
    error = ValueError if "reduction" in options else TypeError
    with pytest.raises(error, match=message):
        rt.cross_entropy(vocab=64, **options)
