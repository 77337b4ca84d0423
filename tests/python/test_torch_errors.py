"""kjit.torch's argument errors: raised before any kernel or GPU is touched, so they run wherever
torch is installed (CPU tensors suffice)."""

import pytest

from conftest import needs_torch

pytestmark = needs_torch

if True:  # imported lazily so that collection works without torch
    try:
        import torch
        import kjit.torch as kt
    except ImportError:
        pass


def test_cpu_tensors_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="logits must be a CUDA tensor"):
        kt.cross_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="x must be a CUDA tensor"):
        kt.rms_norm(torch.randn(4, 8), torch.ones(8))


@pytest.mark.parametrize("logits, target, error, message", [
    (lambda: torch.randn(4, 10, dtype=torch.float64), lambda: torch.zeros(4, dtype=torch.long),
     TypeError, "logits must be float32, float16 or bfloat16"),
    (lambda: torch.randn(4, 10), lambda: torch.zeros(4), TypeError, "class indices"),
    (lambda: torch.randn(4, 10), lambda: torch.zeros(4, dtype=torch.int16), TypeError,
     "target must be int64 or int32"),
    (lambda: torch.randn(2, 4, 10), lambda: torch.zeros(2, 4, dtype=torch.long), ValueError,
     r"logits must be \[rows, vocab\]"),
    (lambda: torch.randn(4, 10), lambda: torch.zeros(5, dtype=torch.long), ValueError,
     r"target must be \[rows\] = \[4\]"),
    (lambda: torch.randn(10, 4).t(), lambda: torch.zeros(4, dtype=torch.long), ValueError,
     "contiguous last dimension"),
])
def test_cross_entropy_argument_errors(logits, target, error, message):
    with pytest.raises(error, match=message):
        kt.cross_entropy(logits(), target())


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduction="avg"), "reduction must be one of"),
    (dict(label_smoothing=1.0), r"label_smoothing must be in \[0, 1\)"),
    (dict(softcap=-1.0), r"softcap must be None or >= 0 \(None or 0: off\)"),
    (dict(z_loss=-1.0), "z_loss must be >= 0"),
])
def test_cross_entropy_option_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kt.cross_entropy(torch.randn(4, 10), torch.zeros(4, dtype=torch.long), **kwargs)


# Issue 45, defect 12: a value of the wrong type named the wrong expected type ("expected an int"
# for label_smoothing="0.1") or none ("'int' object is not iterable" for extras=1). Each error
# names the type expected and quotes what was given, cut short.
@pytest.mark.parametrize("kwargs, message", [
    (dict(label_smoothing="0.1"), r"label_smoothing must be a number \(float\), got str '0\.1'$"),
    (dict(z_loss="1e-3"), r"z_loss must be a number \(float\), got str '1e-3'$"),
    (dict(softcap="3"), r"softcap must be a number \(float\), got str '3'$"),
    (dict(ignore_index="x"), r"ignore_index must be an int, got str 'x'$"),
    (dict(ignore_index=-100.0), r"ignore_index must be an int, got float -100\.0$"),
    (dict(extras=1), r"extras must be True, False, None, a name or an iterable of names of "
                     r"\('lse'.*; got int 1$"),
    (dict(extras=["token_accuracy", 3]), r"extras must be .*; got int 3 among them$"),
    (dict(label_smoothing="0.1" * 30000),
     r"label_smoothing must be a number \(float\), got str '0\.10\.1.{53}\.\.\. "
     r"\(90002 characters\)$"),
])
@pytest.mark.parametrize("loss", ["cross_entropy", "linear_cross_entropy"])
def test_an_option_of_the_wrong_type_names_the_type_and_quotes_the_value(loss, kwargs, message):
    inputs = ((torch.randn(4, 10), torch.zeros(4, dtype=torch.long)) if loss == "cross_entropy"
              else _lce_inputs())
    with pytest.raises(TypeError, match=message) as e:
        getattr(kt, loss)(*inputs, **kwargs)
    assert len(str(e.value)) < 300


@pytest.mark.parametrize("weight, logits_dtype, error, message", [
    (lambda: torch.ones(9), "float32", ValueError,
     r"weight must be a 1-D tensor of vocab = 10 class weights, got shape \(9,\)"),
    (lambda: torch.ones(11), "float32", ValueError, r"vocab = 10 class weights, got shape"),
    (lambda: torch.ones(1, 10), "float32", ValueError,
     r"weight must be a 1-D tensor of vocab = 10 class weights, got shape \(1, 10\)"),
    (lambda: torch.tensor(1.0), "float32", ValueError, r"got shape \(\)"),
    (lambda: torch.ones(10, dtype=torch.float64), "float32", TypeError,
     r"weight must be float32 or the logits' dtype \(torch.float32\), got torch.float64"),
    (lambda: torch.ones(10, dtype=torch.float16), "bfloat16", TypeError,
     r"weight must be float32 or the logits' dtype \(torch.bfloat16\), got torch.float16"),
    (lambda: torch.ones(10, dtype=torch.long), "float32", TypeError, "weight must be float32"),
    (lambda: torch.ones(10, device="meta"), "float32", ValueError,
     "weight is on meta but the input is on cpu"),
    (lambda: [1.0] * 10, "float32", TypeError,
     "weight must be a torch.Tensor or None, got list"),
])
def test_cross_entropy_weight_errors_name_the_argument(weight, logits_dtype, error, message):
    logits = torch.randn(4, 10).to(getattr(torch, logits_dtype))
    target = torch.zeros(4, dtype=torch.long)
    w = weight()
    with pytest.raises(error, match=message):
        kt.cross_entropy(logits, target, w)
    if isinstance(w, torch.Tensor):  # (torch itself refuses a buffer that is not a tensor)
        with pytest.raises(error, match=message):
            kt.CrossEntropyLoss(weight=w)(logits, target)


# (dtypes by name: the parameters are made at collection, where torch may be missing)
@pytest.mark.parametrize("weight, logits_dtype", [
    (lambda: torch.rand(10), "float32"),
    (lambda: torch.rand(10), "bfloat16"),                       # fp32 with any logits
    (lambda: torch.rand(10).to(torch.float16), "float16"),      # the logits' dtype
    (lambda: torch.rand(20)[::2], "float32"),                   # strided: copied, not refused
    (lambda: torch.full((10,), float("nan")), "float32"),       # values are not checked
])
def test_cross_entropy_good_weights_pass_the_checks(weight, logits_dtype):
    # Accepted: the call goes on to the next check, which wants CUDA tensors.
    with pytest.raises(ValueError, match="logits must be a CUDA tensor"):
        kt.cross_entropy(torch.randn(4, 10).to(getattr(torch, logits_dtype)), torch.zeros(4, dtype=torch.long),
                         weight=weight())


def test_cross_entropy_loss_keeps_weight_as_a_buffer():
    w = torch.rand(10)
    loss = kt.CrossEntropyLoss(w, ignore_index=3)
    assert loss.weight is w and loss.ignore_index == 3
    assert list(loss.state_dict()) == ["weight"] and not list(loss.parameters())
    assert loss.to(torch.bfloat16).weight.dtype == torch.bfloat16
    assert kt.CrossEntropyLoss().weight is None and not kt.CrossEntropyLoss().state_dict()


@pytest.mark.parametrize("x, weight, kwargs, error, message", [
    (lambda: torch.randn(4, 8, dtype=torch.float64), lambda: torch.ones(8), {}, TypeError,
     "x must be float32, float16 or bfloat16"),
    (lambda: torch.randn(4, 8), lambda: torch.ones(7), {}, ValueError,
     r"weight must be \[hidden\] = \[8\]"),
    (lambda: torch.randn(4, 8), lambda: torch.ones(8), dict(casting="t5"), ValueError,
     "casting must be one of"),
    (lambda: torch.randn(4, 8, dtype=torch.bfloat16), lambda: torch.ones(8),
     dict(casting="none"), ValueError, "casting 'none' computes in x's dtype"),
    # (x of any strides is taken, as F.rms_norm takes it: test_rms_norm_cpu.py)
])
def test_rms_norm_argument_errors(x, weight, kwargs, error, message):
    with pytest.raises(error, match=message):
        kt.rms_norm(x(), weight(), **kwargs)


def test_strided_rows_are_taken_without_a_copy():
    from kjit.torch import _kernels
    x = torch.randn(3, 5, 16)[:, :, :8]  # rows 16 elements apart: a matrix with row stride 16
    assert _kernels.matrix_shape(x, "x") == (15, 16)


# ---- Linear + cross-entropy ----------------------------------------------------------------------
# (shapes and dtypes by name or lambda: the parameters are made at collection, where torch may be
# missing)

def _lce_inputs(rows=4, vocab=10, hidden=8, dtype="float32"):
    t = getattr(torch, dtype)
    return (torch.randn(rows, hidden).to(t), torch.randn(vocab, hidden).to(t),
            torch.zeros(rows, dtype=torch.long), torch.randn(vocab).to(t))


def test_linear_cross_entropy_refuses_cpu_tensors_naming_the_argument():
    h, w, t, b = _lce_inputs()
    with pytest.raises(ValueError, match="hidden must be a CUDA tensor"):
        kt.linear_cross_entropy(h, w, t, b)
    with pytest.raises(ValueError, match="hidden must be a CUDA tensor"):
        kt.LinearCrossEntropyLoss()(h, w, t)


@pytest.mark.parametrize("change, error, message", [
    (lambda h, w, t, b: (h.double(), w, t, b), TypeError,
     "hidden must be float32, float16 or bfloat16"),
    (lambda h, w, t, b: (h, w.to(torch.bfloat16), t, b), TypeError,
     r"weight must have hidden's dtype \(torch.float32\), got torch.bfloat16"),
    (lambda h, w, t, b: (h, w, t, b.half()), TypeError,
     r"bias must have hidden's dtype \(torch.float32\), got torch.float16"),
    (lambda h, w, t, b: (h, w, t.float(), b), TypeError, "class indices"),
    (lambda h, w, t, b: (h, w, t.short(), b), TypeError, "target must be int64 or int32"),
    (lambda h, w, t, b: (h.view(2, 2, 8), w, t, b), ValueError,
     r"hidden must be \[rows, hidden_size\], got shape \(2, 2, 8\)"),
    (lambda h, w, t, b: (h[:0], w, t[:0], b), ValueError, "hidden has no rows"),
    (lambda h, w, t, b: (h, w[:, :7], t, b), ValueError,
     r"weight must be \[vocab, hidden_size\] = \[vocab, 8\], got shape \(10, 7\)"),
    (lambda h, w, t, b: (h, w[0], t, b), ValueError, r"weight must be \[vocab, hidden_size\]"),
    (lambda h, w, t, b: (h, w, t[:3], b), ValueError, r"target must be \[rows\] = \[4\]"),
    (lambda h, w, t, b: (h, w, t, b[:9]), ValueError,
     r"bias must be \[vocab\] = \[10\], got shape \(9,\)"),
    (lambda h, w, t, b: (h, w, t, b.view(1, 10)), ValueError, r"bias must be \[vocab\]"),
    (lambda h, w, t, b: (h, w, t, [0.0] * 10), TypeError,
     "bias must be a torch.Tensor or None, got list"),
    (lambda h, w, t, b: (h, w.tolist(), t, b), TypeError,
     "weight must be a torch.Tensor, got list"),
    (lambda h, w, t, b: (torch.randn(8, 4).t(), w, t, b), ValueError,
     "hidden must have a contiguous last dimension"),
    (lambda h, w, t, b: (h, torch.randn(8, 10).t(), t, b), ValueError,
     "weight must have a contiguous last dimension"),
])
def test_linear_cross_entropy_argument_errors_name_the_argument(change, error, message):
    args = change(*_lce_inputs())
    with pytest.raises(error, match=message):
        kt.linear_cross_entropy(*args)


@pytest.mark.parametrize("kwargs, message", [
    (dict(reduction="avg"), "reduction must be one of"),
    (dict(label_smoothing=1.0), r"label_smoothing must be in \[0, 1\)"),
    (dict(label_smoothing=-0.1), r"label_smoothing must be in \[0, 1\)"),
    (dict(z_loss=-1e-4), "z_loss must be >= 0"),
    (dict(softcap=-1.0), r"softcap must be None or >= 0 \(None or 0: off\)"),
    (dict(softcap=float("nan")), "softcap must be None or >= 0"),
])
def test_linear_cross_entropy_option_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        kt.linear_cross_entropy(*_lce_inputs(), **kwargs)
    with pytest.raises(ValueError, match=message):
        kt.LinearCrossEntropyLoss(**kwargs)(*_lce_inputs())


@pytest.mark.parametrize("dtype, bias, kwargs", [
    ("float32", True, {}), ("bfloat16", False, {}), ("float16", True, dict(softcap=None)),
    ("float32", True, dict(reduction="none", label_smoothing=0.1, z_loss=1e-4,
                           softcap=30.0)),
])
def test_linear_cross_entropy_good_arguments_pass_the_checks(dtype, bias, kwargs):
    h, w, t, b = _lce_inputs(dtype=dtype)
    # Accepted: the call goes on to the device check, which wants CUDA tensors.
    with pytest.raises(ValueError, match="hidden must be a CUDA tensor"):
        kt.linear_cross_entropy(h, w, t.int(), b if bias else None, **kwargs)


def test_linear_cross_entropy_loss_module_owns_no_parameters():
    loss = kt.LinearCrossEntropyLoss(ignore_index=3, z_loss=1e-4)
    assert not list(loss.parameters()) and not loss.state_dict()
    assert "ignore_index=3" in repr(loss) and "z_loss=0.0001" in repr(loss)


def test_linear_cross_entropy_custom_ops_are_registered():
    from kjit.torch import _kernels  # noqa: F401 (registers them)
    for name in ("linear_cross_entropy_forward", "linear_cross_entropy_forward_backward",
                 "linear_cross_entropy_rescale_"):
        assert hasattr(torch.ops.kjit, name), name


def test_apply_to_refuses_unsupported_models():
    class Config:
        model_type = "gpt2"

    class GPT2LMHeadModel(torch.nn.Module):
        config = Config()

    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        kt.apply_to(GPT2LMHeadModel())
