"""kjit.torch on a GPU: every op and option against float64 torch references (the fused linear +
cross-entropy against F.cross_entropy of the logits), autograd, torch.compile,
CUDA graphs and apply_to on small Hugging Face models. Skips visibly without torch or a GPU.

Tolerances: |out - ref| <= atol + rtol * |ref| elementwise, with rtol one rounding of the output
dtype (fp32 math inside) and atol tied to the size of the values (test_comparator_rejects_...
shows each check failing on a slightly perturbed output).
"""

import copy
import math

import pytest

from conftest import needs_gpu, needs_torch, small_hf_model

pytestmark = [needs_torch, needs_gpu]

try:
    import torch
    import torch.nn.functional as F
    import kjit.torch as kt
except ImportError:
    pass

RTOL = {"fp32": 2e-6, "fp16": 2 ** -10, "bf16": 2 ** -7}
DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def dtype_of(name):
    return getattr(torch, DTYPES[name])


def assert_close(out, ref, rtol, atol, what):
    out64, ref64 = out.detach().double(), ref.detach().double()
    assert out64.shape == ref64.shape, f"{what}: shape {tuple(out64.shape)} != {tuple(ref64.shape)}"
    bad = ~((out64 - ref64).abs() <= atol + rtol * ref64.abs())
    bad &= ~(out64.isnan() & ref64.isnan())
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.numel()} elements off, first at "
                             f"{i}: {out64[tuple(i)].item()} vs {ref64[tuple(i)].item()} "
                             f"(rtol {rtol}, atol {atol})")


# ---- Cross-entropy ------------------------------------------------------------------------------

def ce_reference(logits, target, ignore_index, reduction, label_smoothing, z_loss, softcap):
    """float64 loss, lse and gradient (torch autograd) of kjit's definition
    (include/kjit/cross_entropy.h), which is F.cross_entropy's plus z-loss and soft-cap."""
    x = logits.detach().double().requires_grad_()
    capped = softcap * torch.tanh(x / softcap) if softcap else x
    lse = torch.logsumexp(capped, dim=-1)
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    nll = lse - capped.gather(1, safe[:, None])[:, 0]
    smooth = lse - capped.mean(dim=-1)
    per_row = (1 - label_smoothing) * nll + label_smoothing * smooth + z_loss * lse ** 2
    per_row = torch.where(valid, per_row, torch.zeros_like(per_row))
    if reduction == "none":
        loss = per_row
    elif reduction == "sum":
        loss = per_row.sum()
    else:
        loss = per_row.sum() / valid.sum()
    loss.backward(torch.ones_like(loss))
    return loss.detach(), lse.detach(), x.grad


def make_ce_inputs(rows, vocab, dtype, ignore_fraction=0.2, seed=0, scale=4.0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    logits = (torch.randn(rows, vocab, device="cuda", generator=g) * scale).to(dtype_of(dtype))
    target = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    if rows > 2:  # the first and last class always appear
        target[0], target[1] = 0, vocab - 1
    ignored = torch.rand(rows, device="cuda", generator=g) < ignore_fraction
    target[ignored] = -100
    return logits, target


def run_ce(logits, target, **kwargs):
    """kjit's loss and gradient through autograd. The op sees an intermediate (a view of a leaf),
    as it sees lm_head's output, so the gradient goes in place."""
    leaf = logits.clone().requires_grad_()
    loss, lse = kt.cross_entropy(leaf.view_as(leaf), target, return_lse=True, **kwargs)
    (grad,) = torch.autograd.grad(loss, leaf, torch.ones_like(loss))
    return loss, lse, grad


def check_ce(rows, vocab, dtype, reduction="mean", label_smoothing=0.0, z_loss=0.0, softcap=None,
             ignore_fraction=0.2, **kwargs):
    logits, target = make_ce_inputs(rows, vocab, dtype, ignore_fraction)
    loss, lse, grad = run_ce(logits, target, reduction=reduction, label_smoothing=label_smoothing,
                             z_loss=z_loss, softcap=softcap, **kwargs)
    ref_loss, ref_lse, ref_grad = ce_reference(logits, target, -100, reduction, label_smoothing,
                                               z_loss, softcap or 0.0)
    assert loss.dtype == torch.float32
    assert_close(loss, ref_loss, 1e-5, 1e-5, "loss")
    assert_close(lse, ref_lse, 1e-6, 1e-5, "lse")
    # A gradient entry is about 1/rows (mean) at most 1: atol a 1/1000 of the largest.
    atol = 1e-3 * ref_grad.abs().max().item() + 1e-30
    assert_close(grad, ref_grad, RTOL[dtype], atol, "grad")
    return loss, grad, ref_grad


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_matches_fp64(dtype, reduction):
    check_ce(37, 32000, dtype, reduction)


@pytest.mark.parametrize("vocab", [50257, 151936, 256000])
def test_cross_entropy_large_odd_vocabularies(vocab):
    check_ce(19, vocab, "bf16")


@pytest.mark.parametrize("options", [
    dict(label_smoothing=0.1), dict(z_loss=1e-4), dict(softcap=30.0),
    dict(label_smoothing=0.05, z_loss=1e-4, softcap=15.0, reduction="none"),
])
def test_cross_entropy_options(options):
    check_ce(33, 50257, "bf16", **options)


def test_cross_entropy_matches_torch_semantics():
    logits, target = make_ce_inputs(64, 1000, "fp32")
    for kwargs in (dict(), dict(label_smoothing=0.2), dict(reduction="sum"),
                   dict(reduction="none")):
        ours = kt.cross_entropy(logits, target, **kwargs)
        theirs = F.cross_entropy(logits.double(), target, **kwargs)
        assert_close(ours, theirs, 1e-5, 1e-5, f"F.cross_entropy {kwargs}")


def test_cross_entropy_one_row_and_all_ignored():
    check_ce(1, 50257, "bf16", ignore_fraction=0.0)
    logits, target = make_ce_inputs(8, 1000, "bf16")
    target[:] = -100
    loss, _, grad = run_ce(logits, target)
    assert torch.isnan(loss), "mean over no valid rows is NaN, as torch gives"
    assert torch.count_nonzero(grad) == 0
    loss_sum, _, _ = run_ce(logits, target, reduction="sum")
    assert loss_sum.item() == 0.0


def test_comparator_rejects_a_perturbed_gradient():
    logits, target = make_ce_inputs(16, 5000, "bf16")
    _, grad, ref_grad = check_ce(16, 5000, "bf16")
    perturbed = grad.clone()
    perturbed.view(-1)[123] += 0.01 * ref_grad.abs().max().to(perturbed.dtype)
    with pytest.raises(AssertionError, match="elements off"):
        assert_close(perturbed, ref_grad, RTOL["bf16"], 1e-3 * ref_grad.abs().max().item(), "g")


def test_gradient_is_written_in_place_for_intermediates_only():
    logits, target = make_ce_inputs(8, 1000, "bf16")
    leaf = logits.clone().requires_grad_()
    loss = kt.cross_entropy(leaf.view_as(leaf), target)
    assert not torch.equal(leaf.detach(), logits), "the gradient went over the intermediate"
    (grad,) = torch.autograd.grad(loss, leaf)
    assert grad.data_ptr() == leaf.data_ptr()
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss2 = kt.cross_entropy(logits.clone().requires_grad_().view(-1, 1000), target)
        loss2.backward(retain_graph=True)
        loss2.backward()
    leaf2 = logits.clone().requires_grad_()
    kt.cross_entropy(leaf2, target).backward()
    assert torch.equal(leaf2.detach(), logits), "a leaf's values are the caller's"
    view = leaf2.view_as(leaf2)  # an intermediate that requires grad...
    with torch.no_grad():  # ...but no backward will come: the logits are left alone
        kt.cross_entropy(view, target)
    assert torch.equal(leaf2.detach(), logits)
    # An op that saved the logits for its backward makes autograd refuse, not compute garbage.
    leaf3 = logits.float().requires_grad_()
    saved = torch.tanh(leaf3)  # tanh saves its output
    loss = kt.cross_entropy(saved, target)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_upstream_gradient_is_applied(reduction):
    logits, target = make_ce_inputs(24, 3000, "fp32")
    _, _, ref_grad = ce_reference(logits, target, -100, reduction, 0.0, 0.0, 0.0)
    up = torch.rand(24 if reduction == "none" else (), device="cuda") + 0.5
    for declared in (None, up):  # undeclared: the backward rescales; declared: nothing to do
        leaf = logits.clone().requires_grad_()
        loss = kt.cross_entropy(leaf.view_as(leaf), target, reduction=reduction,
                                grad_scale=declared)
        (grad,) = torch.autograd.grad(loss, leaf, up)
        expected = ref_grad * (up[:, None] if reduction == "none" else up).double()
        assert_close(grad, expected, 1e-5, 1e-7, f"grad, grad_scale={declared is not None}")


def test_cross_entropy_is_deterministic():
    logits, target = make_ce_inputs(300, 50257, "bf16")
    a = run_ce(logits, target)
    b = run_ce(logits, target)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


# ---- Cross-entropy with class weights ----------------------------------------------------------

def weighted_reference(logits, target, weight, reduction, label_smoothing):
    """float64 loss and gradient of torch's own F.cross_entropy with `weight` (the definition kjit
    follows, label smoothing included)."""
    x = logits.detach().double().requires_grad_()
    loss = F.cross_entropy(x, target, weight=weight.double(), ignore_index=-100,
                           reduction=reduction, label_smoothing=label_smoothing)
    loss.backward(torch.ones_like(loss))
    return loss.detach(), x.grad


def make_class_weights(target, vocab, dtype, seed=1, low=0.0):
    """Weights in [low, low + 2) of `dtype`, every seventh class and the first valid row's target
    weighing 0 (that row's loss then comes from label smoothing only)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    weight = torch.rand(vocab, device="cuda", generator=g) * 2 + low
    weight[::7] = 0
    weight[target[target != -100][0]] = 0
    return weight.to(dtype_of(dtype))


def check_weighted_ce(logits, target, weight, reduction, label_smoothing, **kwargs):
    loss, lse, grad = run_ce(logits, target, weight=weight, reduction=reduction,
                             label_smoothing=label_smoothing, **kwargs)
    ref_loss, ref_grad = weighted_reference(logits, target, weight, reduction, label_smoothing)
    assert loss.dtype == torch.float32
    assert_close(loss, ref_loss, 1e-5, 1e-5, "loss")
    assert_close(lse, torch.logsumexp(logits.double(), dim=-1), 1e-6, 1e-5, "lse")
    atol = 1e-3 * ref_grad.abs().max().item() + 1e-30
    rtol = RTOL[next(name for name in DTYPES if dtype_of(name) == logits.dtype)]
    assert_close(grad, ref_grad, rtol, atol, "grad")


@pytest.mark.parametrize("dtype, weight_dtype, reduction, label_smoothing", [
    *(("bf16", "fp32", r, ls) for r in ("mean", "sum", "none") for ls in (0.0, 0.1)),
    ("bf16", "bf16", "mean", 0.1), ("bf16", "bf16", "none", 0.0),
    ("fp32", "fp32", "mean", 0.1), ("fp32", "fp32", "sum", 0.0),
    ("fp16", "fp16", "sum", 0.1),
])
def test_cross_entropy_class_weights_match_torch_fp64(dtype, weight_dtype, reduction,
                                                      label_smoothing):
    logits, target = make_ce_inputs(37, 50257, dtype)
    target[3] = -100  # an ignored row whatever the draw
    weight = make_class_weights(target, 50257, weight_dtype)
    check_weighted_ce(logits, target, weight, reduction, label_smoothing)


def test_cross_entropy_class_weights_every_path():
    """The module (weight a buffer moved by .cuda()), a leaf's out-of-place gradient, the forward
    alone, an upstream gradient the backward rescales (the weighted op's rescale), z-loss and
    softcap alongside, and torch.compile: each against the float64 reference."""
    vocab = 50257
    logits, target = make_ce_inputs(24, vocab, "bf16")
    weight = make_class_weights(target, vocab, "fp32")
    module = kt.CrossEntropyLoss(weight.cpu(), label_smoothing=0.1).cuda()
    assert module.weight.device.type == "cuda"
    ref_loss, ref_grad = weighted_reference(logits, target, weight, "mean", 0.1)
    leaf = logits.clone().requires_grad_()
    loss = module(leaf, target)  # a leaf: the gradient is allocated, the logits kept
    loss.backward()
    assert torch.equal(leaf.detach(), logits)
    assert_close(loss, ref_loss, 1e-5, 1e-5, "module loss")
    assert_close(leaf.grad, ref_grad, RTOL["bf16"], 1e-3 * ref_grad.abs().max().item(),
                 "module grad")
    with torch.no_grad():
        assert_close(kt.cross_entropy(logits, target, weight, label_smoothing=0.1), ref_loss,
                     1e-5, 1e-5, "forward only")

    up = torch.rand(24, device="cuda") + 0.5
    _, ref_none = weighted_reference(logits, target, weight, "none", 0.0)
    leaf = logits.clone().requires_grad_()
    loss = kt.cross_entropy(leaf.view_as(leaf), target, weight, reduction="none")
    (grad,) = torch.autograd.grad(loss, leaf, up)
    expected = ref_none * up[:, None].double()
    # Rounded twice to bf16: by forward_backward (for upstream 1), then by the rescale.
    assert_close(grad, expected, 2 * RTOL["bf16"], 1e-3 * expected.abs().max().item(), "rescaled")

    # z-loss (weighing w_t, kjit's) and softcap with weights: the gradient against
    # ce_reference's formula with the weights put in as include/kjit/cross_entropy.h states.
    x = logits.detach().double().requires_grad_()
    capped = 15.0 * torch.tanh(x / 15.0)
    lse = torch.logsumexp(capped, dim=-1)
    valid = target != -100
    safe = torch.where(valid, target, torch.zeros_like(target))
    w64 = weight.double()
    w_t = torch.where(valid, w64[safe], torch.zeros_like(lse))
    per_row = w_t * (lse - capped.gather(1, safe[:, None])[:, 0] + 1e-4 * lse ** 2)
    per_row = torch.where(valid, per_row, torch.zeros_like(per_row))
    ref = per_row.sum() / w_t.sum()
    ref.backward()
    loss, _, grad = run_ce(logits, target, weight=weight, z_loss=1e-4, softcap=15.0)
    assert_close(loss, ref.detach(), 1e-5, 1e-5, "z-loss and softcap loss")
    assert_close(grad, x.grad, RTOL["bf16"], 1e-3 * x.grad.abs().max().item(),
                 "z-loss and softcap grad")

    compiled = torch.compile(lambda a, t, w: kt.cross_entropy(a, t, w, label_smoothing=0.1),
                             fullgraph=True)
    leaf = logits.clone().requires_grad_()
    loss = compiled(leaf, target, weight)
    loss.backward()
    assert_close(loss, ref_loss, 1e-5, 1e-5, "compiled loss")
    assert_close(leaf.grad, ref_grad, RTOL["bf16"], 1e-3 * ref_grad.abs().max().item(),
                 "compiled grad")


def test_cross_entropy_class_weights_used_as_given_as_torch_does():
    """Negative weights count as negative; a NaN weight makes NaN the rows it enters (with label
    smoothing every valid row; without, only the rows targeting it), as torch's loss has it."""
    vocab = 5000
    logits, target = make_ce_inputs(32, vocab, "fp32")
    negative = make_class_weights(target, vocab, "fp32", low=-0.5)
    assert (negative < 0).any()
    check_weighted_ce(logits, target, negative, "sum", 0.1)
    check_weighted_ce(logits, target, negative, "none", 0.0)

    nan_class = next(c for c in range(1, vocab) if not (target == c).any())
    weight = torch.ones(vocab, device="cuda")
    weight[nan_class] = float("nan")
    target[5] = nan_class
    for label_smoothing in (0.0, 0.1):
        ours = kt.cross_entropy(logits, target, weight, reduction="none",
                                label_smoothing=label_smoothing)
        theirs = F.cross_entropy(logits.double(), target, weight=weight.double(),
                                 reduction="none", label_smoothing=label_smoothing)
        assert_close(ours, theirs, 1e-5, 1e-5, f"NaN weight, label_smoothing {label_smoothing}")
        nan_rows = ours.isnan()
        expected = (target != -100) if label_smoothing else (target == nan_class)
        assert torch.equal(nan_rows, expected), (nan_rows, expected)


def test_comparator_rejects_a_wrongly_weighted_loss():
    logits, target = make_ce_inputs(16, 5000, "bf16")
    weight = make_class_weights(target, 5000, "fp32")
    ours = kt.cross_entropy(logits, target, weight, reduction="none")
    theirs, _ = weighted_reference(logits, target, weight, "none", 0.0)
    assert_close(ours, theirs, 1e-5, 1e-5, "weighted")
    unweighted, _ = weighted_reference(logits, target, torch.ones_like(weight), "none", 0.0)
    with pytest.raises(AssertionError, match="elements off"):
        assert_close(ours, unweighted, 1e-5, 1e-5, "unweighted")


# No torch.autograd.gradcheck for cross-entropy: kjit has no float64 kernels, and gradcheck runs the
# backward several times per forward, which the fused op does not allow (its gradient is computed in
# the forward and rescaled in place). The float64 comparisons above check the gradient instead.


# ---- Linear + cross-entropy ---------------------------------------------------------------------
# Inputs on a lattice the GEMM computes exactly in every dtype (hidden in {-1/4, 0, 1/4}, weight in
# {-1, 0, 1}, bias in quarters of [-2, 2]: logits are quarters below 32, which even bf16 holds), so
# that the fp64 reference sees the very logits kjit's loss reads. What remains is the loss's fp32
# math (rtol 1e-5) and, for the gradients, the logits' gradient rounded to the dtype in its chunk
# buffer before the gradient GEMMs (fp32 accumulation) and each output's final rounding: at most
# 2^-9 of sum_j |dlogits_j| |w_j| <= 2 * 2^-9 of the gradient's scale in bf16. Hence rtol two of
# the dtype's roundings and atol LCE_ATOL of the largest reference gradient (four times that
# bound); test_lce_comparator_rejects_... shows a 2% error in one element failing.

LCE_ATOL = {"fp32": 1e-5, "fp16": 2 ** -9, "bf16": 2 ** -6}


def make_lce_inputs(rows, vocab, hidden, dtype, bias=True, seed=0, target_type=None):
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = dtype_of(dtype)
    h = (torch.randint(-1, 2, (rows, hidden), device="cuda", generator=g) / 4).to(t)
    w = torch.randint(-1, 2, (vocab, hidden), device="cuda", generator=g).to(t)
    b = (torch.randint(-8, 9, (vocab,), device="cuda", generator=g) / 4).to(t) if bias else None
    target = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    if rows > 2:  # the first and last class always appear
        target[0], target[1] = 0, vocab - 1
    target[torch.rand(rows, device="cuda", generator=g) < 0.2] = -100
    if rows > 3:
        target[3] = -100  # an ignored row whatever the draw
    return h, w, b, target.to(target_type or torch.int64)


def lce_reference(h, w, b, target, up, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                  softcap=0.0, class_weight=None):
    """float64 loss and gradients (for upstream gradient `up`) of torch's own
    F.cross_entropy(h @ w.T + b), soft-capped and with z-loss as include/kjit/cross_entropy.h
    defines them."""
    h64 = h.detach().double().requires_grad_()
    w64 = w.detach().double().requires_grad_()
    b64 = b.detach().double().requires_grad_() if b is not None else None
    logits = F.linear(h64, w64, b64)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    target = target.long()
    cw = None if class_weight is None else class_weight.double()
    per_row = F.cross_entropy(logits, target, weight=cw, ignore_index=-100, reduction="none",
                              label_smoothing=label_smoothing)
    valid = target != -100
    w_t = torch.ones_like(per_row) if cw is None else cw[torch.where(valid, target, 0)]
    if z_loss:
        z = z_loss * torch.logsumexp(logits, dim=-1) ** 2 * w_t
        per_row = per_row + torch.where(valid, z, torch.zeros_like(z))
    if reduction == "none":
        loss = per_row
    elif reduction == "sum":
        loss = per_row.sum()
    else:
        loss = per_row.sum() / torch.where(valid, w_t, 0).sum()
    loss.backward(up.double())
    return loss.detach(), h64.grad, w64.grad, (b64.grad if b is not None else None)


def run_lce(h, w, b, target, up, **kwargs):
    """kjit's loss and gradients through autograd, every input a leaf that requires grad."""
    hl, wl = h.clone().requires_grad_(), w.clone().requires_grad_()
    bl = b.clone().requires_grad_() if b is not None else None
    loss = kt.linear_cross_entropy(hl, wl, target, bl, **kwargs)
    loss.backward(up)
    return loss, hl.grad, wl.grad, (bl.grad if bl is not None else None)


def upstream(reduction, rows, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand(rows if reduction == "none" else (), device="cuda", generator=g) + 0.5


def check_lce(rows, vocab, hidden, dtype, reduction="mean", bias=True, target_type=None,
              **options):
    h, w, b, target = make_lce_inputs(rows, vocab, hidden, dtype, bias, target_type=target_type)
    up = upstream(reduction, rows)
    got = run_lce(h, w, b, target, up, reduction=reduction, **options)
    options.pop("weight_grad_accumulation", None)
    ref = lce_reference(h, w, b, target, up, reduction, **options)
    assert got[0].dtype == torch.float32
    assert_close(got[0], ref[0], 1e-5, 1e-5, "loss")
    for name, out, expected, t in zip(("d_hidden", "d_weight", "d_bias"), got[1:], ref[1:],
                                      (h, w, b)):
        if expected is None:
            assert out is None
            continue
        assert out.dtype == t.dtype and out.shape == t.shape, name
        atol = LCE_ATOL[dtype] * expected.abs().max().item() + 1e-30
        assert_close(out, expected, 2 * RTOL[dtype], atol, name)
    return got, ref


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_matches_torch_fp64(dtype, reduction):
    check_lce(77, 1000, 64, dtype, reduction)


@pytest.mark.parametrize("options", [
    dict(label_smoothing=0.1), dict(z_loss=1e-3), dict(softcap=5.0),
    dict(bias=False, target_type="int32"),
    dict(label_smoothing=0.05, z_loss=1e-3, softcap=8.0, reduction="none"),
    dict(class_weight="fp32"), dict(class_weight="bf16", label_smoothing=0.1, z_loss=1e-3),
    dict(class_weight="fp32", reduction="sum", weight_grad_accumulation="output_dtype"),
])
def test_linear_cross_entropy_options(options):
    options = dict(options)
    if "target_type" in options:
        options["target_type"] = getattr(torch, options["target_type"])
    if "class_weight" in options:
        g = torch.Generator(device="cuda").manual_seed(5)
        options["class_weight"] = (torch.rand(1000, device="cuda", generator=g) * 2).to(
            dtype_of(options["class_weight"]))
    check_lce(77, 1000, 64, "bf16", **options)


def test_linear_cross_entropy_larger_shape():
    check_lce(300, 50257, 256, "bf16")


def test_linear_cross_entropy_grads_only_for_inputs_that_require_them():
    h, w, b, target = make_lce_inputs(40, 1000, 64, "bf16")
    ref_loss, ref_dh, ref_dw, ref_db = lce_reference(h, w, b, target, torch.ones((), device="cuda"))
    with torch.no_grad():
        forward_only = kt.linear_cross_entropy(h, w, target, b)
    assert_close(forward_only, ref_loss, 1e-5, 1e-5, "forward only")
    hl = h.clone().requires_grad_()  # a frozen lm_head (LoRA): d_hidden alone
    loss = kt.linear_cross_entropy(hl, w, target, b)
    loss.backward()
    assert_close(loss, forward_only, 1e-6, 1e-6, "the fused pass's loss")
    assert_close(hl.grad, ref_dh, 2 * RTOL["bf16"], LCE_ATOL["bf16"] * ref_dh.abs().max().item(),
                 "d_hidden alone")
    wl, bl = w.clone().requires_grad_(), b.clone().requires_grad_()
    kt.linear_cross_entropy(h, wl, target, bl).backward()
    assert_close(wl.grad, ref_dw, 2 * RTOL["bf16"], LCE_ATOL["bf16"] * ref_dw.abs().max().item(),
                 "d_weight without d_hidden")
    assert_close(bl.grad, ref_db, 2 * RTOL["bf16"], LCE_ATOL["bf16"] * ref_db.abs().max().item(),
                 "d_bias without d_hidden")
    assert not kt.linear_cross_entropy(h, w, target, b).requires_grad


def test_linear_cross_entropy_gradients_accumulate_and_backward_runs_once():
    h, w, b, target = make_lce_inputs(40, 1000, 64, "fp32")
    wl = w.clone().requires_grad_()
    kt.linear_cross_entropy(h, wl, target, b).backward()
    once = wl.grad.clone()
    kt.linear_cross_entropy(h, wl, target, b).backward()  # autograd adds into .grad
    assert_close(wl.grad, 2 * once, 1e-6, 0, "accumulated d_weight")
    loss = kt.linear_cross_entropy(h.clone().requires_grad_(), wl, target, b)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_linear_cross_entropy_grad_scale_is_the_upstream_gradient_computed_for(reduction):
    h, w, b, target = make_lce_inputs(77, 1000, 64, "bf16")
    up = upstream(reduction, 77)
    ref = lce_reference(h, w, b, target, up, reduction)
    # Declared right, the backward's rescale leaves the forward's bits: those of the fused pass
    # told the upstream gradient directly.
    from kjit.torch import _kernels
    # (no class weights, no extras, all three gradients; the options as _LCE_OPTIONS lists them)
    direct_grads = _kernels.linear_cross_entropy_forward_backward(
        h, w, target, b, None, up.reshape(1), False, False, False, True, True, True, -100,
        reduction, 0.0, 0.0, 0.0, "fp32")[-3:]
    for declared in (up, up.item(), 2.0):  # a tensor, a float, and another value (rescaled)
        got = run_lce(h, w, b, target, up, reduction=reduction, grad_scale=declared)
        assert_close(got[0], ref[0], 1e-5, 1e-5, "loss")
        for name, out, expected in zip(("d_hidden", "d_weight", "d_bias"), got[1:], ref[1:]):
            atol = LCE_ATOL["bf16"] * expected.abs().max().item()
            assert_close(out, expected, 2 * RTOL["bf16"], atol, f"{name}, declared {declared}")
        if declared is up:
            assert all(torch.equal(x, y) for x, y in zip(got[1:], direct_grads))


def test_linear_cross_entropy_is_deterministic():
    h, w, b, target = make_lce_inputs(300, 5000, 128, "bf16")
    up = torch.ones((), device="cuda")
    a, b_ = run_lce(h, w, b, target, up), run_lce(h, w, b, target, up)
    assert all(torch.equal(x, y) for x, y in zip(a, b_))


def test_lce_comparator_rejects_a_perturbed_weight_gradient():
    (_, _, dw, _), (_, _, ref_dw, _) = check_lce(77, 1000, 64, "bf16")
    perturbed = dw.clone()
    perturbed.view(-1)[123] += 0.02 * ref_dw.abs().max().to(perturbed.dtype)
    with pytest.raises(AssertionError, match="elements off"):
        assert_close(perturbed, ref_dw, 2 * RTOL["bf16"],
                     LCE_ATOL["bf16"] * ref_dw.abs().max().item(), "d_weight")


class TinyHead(torch.nn.Module if "torch" in globals() else object):
    """An lm_head (with a bias) and its loss: kjit's fused op, or the logits and kjit's loss."""

    def __init__(self, vocab=1000, hidden=64, fused=True):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, hidden)
        self.head = torch.nn.Linear(hidden, vocab)
        self.loss = kt.LinearCrossEntropyLoss(label_smoothing=0.1)
        self.fused = fused

    def forward(self, x, labels):
        h = torch.tanh(self.proj(x))
        if self.fused:
            return self.loss(h, self.head.weight, labels, self.head.bias)
        return kt.cross_entropy(self.head(h), labels, label_smoothing=0.1)


def test_linear_cross_entropy_torch_compile_fullgraph():
    torch.manual_seed(0)
    eager = TinyHead().cuda().to(torch.bfloat16)
    compiled_model = copy.deepcopy(eager)
    unfused = copy.deepcopy(eager)
    unfused.fused = False
    compiled = torch.compile(compiled_model, fullgraph=True)
    g = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(96, 64, device="cuda", generator=g).to(torch.bfloat16)
    labels = torch.randint(0, 1000, (96,), device="cuda", generator=g)
    labels[:5] = -100
    losses = []
    for model in (eager, compiled, unfused):
        loss = model(x, labels)
        (loss * 2).backward()  # an upstream gradient of 2
        losses.append(loss)
    # (Inductor may fuse proj's bias add and the tanh, rounding h once rather than twice.)
    assert_close(losses[1], losses[0], 1e-3, 1e-3, "compiled loss")
    # The unfused path rounds the logits to bf16 as lm_head's output too: the same loss up to
    # the GEMMs' summation order.
    assert_close(losses[2], losses[0], 1e-3, 1e-3, "unfused loss")
    for (name, p), q, u in zip(eager.named_parameters(), compiled_model.parameters(),
                               unfused.parameters()):
        scale = p.grad.abs().max().item()
        assert_close(q.grad, p.grad, 2 ** -6, 2e-2 * scale, f"compiled grad {name}")
        assert_close(u.grad, p.grad, 2 ** -6, 2e-2 * scale, f"unfused grad {name}")


# ---- RMSNorm ------------------------------------------------------------------------------------

def none_rstd(xs, eps, dtype):
    """Casting none's rstd (kjit/rms_norm.h) in float64 from h = xs: round(rsqrt(round(round(
    mean(round(h^2))) + eps))), the + eps in fp32, every round() to `dtype`."""
    def rnd(t):
        return t.to(dtype).double()
    mean = rnd(rnd(xs * xs).sum(-1, keepdim=True) / xs.shape[-1])
    return rnd(torch.rsqrt((mean.float() + torch.tensor(eps, dtype=torch.float32)).to(dtype)
                           .double()))


def norm_reference(x, weight, eps, casting, offset, residual=None, rstd=None):
    """float64 forward as Hugging Face rounds it (llama: the normalized x rounded to x's dtype
    before the weight multiply; gemma: fp32 to the end; none: every intermediate rounded as
    kjit/rms_norm.h states, normalizing with `rstd`, the kernel's ([rows, 1]; none_rstd's
    when not given), since an fp32 mean near a tie may round either way), and fp64 gradients of
    the same formula without the rounding (none: the formula of its backward, with that rstd)."""
    xs = x.detach().double()
    if residual is not None:  # h = x + residual, rounded to the dtype (as torch's add gives it)
        xs = (xs + residual.detach().double()).to(x.dtype).double()
    xs.requires_grad_()
    w = weight.detach().double().requires_grad_()
    if casting == "none":
        rs = (none_rstd(xs.detach(), eps, x.dtype) if rstd is None else rstd.double()).detach()
        # Valued x * rs, with the gradient rs * (g - xhat * mean(g * xhat)) of the backward.
        q = (xs * rs).pow(2).mean(-1, keepdim=True)
        normed = xs * rs * (1 - (q - q.detach()) / 2)
    else:
        normed = xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)
    y_exact = normed * (offset + w)
    if casting == "llama":
        y_rounded = normed.to(x.dtype).double() * (offset + w.detach())
    elif casting == "none":
        y_rounded = normed.to(x.dtype).double() * (offset + w.detach()).to(x.dtype).double()
    else:
        y_rounded = y_exact.detach()
    return y_rounded.detach(), y_exact, xs, w


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("hidden", [1, 7, 4095, 4096, 65536])
@pytest.mark.parametrize("casting", ["llama", "gemma", "none"])
def test_rms_norm_matches_fp64(dtype, hidden, casting, rows=5):
    torch.manual_seed(hidden)
    x = torch.randn(rows, hidden, device="cuda").to(dtype_of(dtype))
    offset = 1.0 if casting == "gemma" else 0.0
    weight = (torch.randn(hidden, device="cuda") * 0.5 + (0 if offset else 1)).to(dtype_of(dtype))
    leaf = x.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    y = kt.rms_norm(leaf, w, 1e-6, casting=casting, offset=offset)
    dy = torch.randn_like(y)
    y.backward(dy)
    rstd = None
    if casting == "none":
        # The kernel's rstd: a value of the dtype, at most one unit in its last place from the
        # exact sum's (rounding a mean near a tie the other way), and what y and the backward use.
        from kjit.torch import _kernels
        rstd = _kernels.rms_norm_forward(x, weight, None, 1e-6, offset, "none")[1][:, None]
        assert torch.equal(rstd, rstd.to(x.dtype).float()), "rstd is not a value of the dtype"
        chain = none_rstd(x.double(), 1e-6, x.dtype)
        assert_close(rstd, chain, 2 * RTOL[dtype], 0, "rstd")
    y_ref, y_exact, xs, w64 = norm_reference(x, weight, 1e-6, casting, offset, rstd=rstd)
    assert y.dtype == x.dtype
    assert_close(y, y_ref, RTOL[dtype], 1e-6, "y")
    y_exact.backward(dy.double())
    scale = xs.grad.abs().max().item()
    assert_close(leaf.grad, xs.grad, 4 * RTOL[dtype], 1e-2 * scale * max(RTOL[dtype], 1e-4) + 1e-6,
                 "dx")
    wscale = w64.grad.abs().max().item()
    assert_close(w.grad, w64.grad, 4 * RTOL[dtype], 1e-3 * wscale + 1e-6, "dw")


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("hidden", [4095, 4096])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_none_is_eager_torch_in_the_dtype(dtype, hidden, offset, rows=64):
    """casting="none" gives the bits of `x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) *
    (offset + w)` in eager PyTorch, except in a row whose fp32 mean lies within its summation
    error of a tie of the dtype (the two rstd then one unit in the last place apart)."""
    from kjit.torch import _kernels
    torch.manual_seed(hidden + int(offset))
    t = dtype_of(dtype)
    x = torch.randn(rows, hidden, device="cuda").to(t)
    w = (torch.randn(hidden, device="cuda") * 0.1 + (0 if offset else 1)).to(t)
    eager_rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    eager = x * eager_rstd * (offset + w)
    y, rstd, _ = _kernels.rms_norm_forward(x, w, None, 1e-6, offset, "none")
    same = rstd == eager_rstd[:, 0].float()
    assert same.float().mean().item() >= 0.9, f"rstd differs from torch's in {int((~same).sum())}"
    assert torch.equal(y[same], eager[same])
    assert torch.equal(kt.rms_norm(x, w, 1e-6, casting="none", offset=offset), y)


@pytest.mark.parametrize("hidden", [1, 4096, 65536])
def test_rms_norm_one_row(hidden):
    test_rms_norm_matches_fp64("bf16", hidden, "llama", rows=1)


def test_rms_norm_fused_residual_and_shapes():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4096, device="cuda", dtype=torch.bfloat16).requires_grad_()
    r = torch.randn(2, 3, 4096, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = (torch.rand(4096, device="cuda") + 0.5).to(torch.bfloat16).requires_grad_()
    y, h = kt.rms_norm(x, w, 1e-5, residual=r)
    assert_close(h, x.double() + r.double(), RTOL["bf16"], 0, "h")
    y_ref, y_exact, hs, w64 = norm_reference(x, w, 1e-5, "llama", 0.0, residual=r)
    assert_close(y, y_ref, RTOL["bf16"], 1e-6, "y")
    dy, dh = torch.randn_like(y), torch.randn_like(h)
    (y.float() * dy.float()).sum().add((h.float() * dh.float()).sum()).backward()
    (y_exact * dy.double()).sum().add((hs * dh.double()).sum()).backward()
    scale = hs.grad.abs().max().item()
    assert_close(x.grad, hs.grad, 4 * RTOL["bf16"], 1e-2 * scale * RTOL["bf16"], "dx")
    assert torch.equal(x.grad, r.grad), "the residual's gradient is dx"
    assert_close(w.grad, w64.grad, 4 * RTOL["bf16"], 1e-3 * w64.grad.abs().max().item(), "dw")


def test_rms_norm_matches_hugging_face_modules():
    from transformers.models.gemma2.modeling_gemma2 import Gemma2RMSNorm
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    torch.manual_seed(1)
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    for module, casting, offset in ((LlamaRMSNorm(2048, 1e-5), "llama", 0.0),
                                    (Gemma2RMSNorm(2048, 1e-6), "gemma", 1.0)):
        module = module.cuda().to(torch.bfloat16)
        with torch.no_grad():
            module.weight.normal_(0.0, 0.5)
        ref = module(x)
        ours = kt.rms_norm(x, module.weight, 1e-5 if casting == "llama" else 1e-6,
                           casting=casting, offset=offset)
        # The same roundings in the same places: at most one bf16 ulp apart (the sums of squares
        # are added in another order), and nearly always equal.
        assert_close(ours, ref, 2 ** -7, 0, f"{type(module).__name__}")
        assert (ours == ref).float().mean().item() > 0.98


def test_rms_norm_gradcheck_fp32():
    x = torch.randn(3, 8, device="cuda", requires_grad=True)
    w = torch.rand(8, device="cuda", requires_grad=True)
    fn = lambda a, b: kt.rms_norm(a, b, 1e-5, casting="gemma", offset=1.0)
    assert torch.autograd.gradcheck(fn, (x, w), eps=1e-2, atol=5e-3, rtol=1e-2)


# ---- torch.compile, CUDA graphs ----------------------------------------------------------------

class TinyLM(torch.nn.Module if "torch" in globals() else object):
    def __init__(self, vocab=1000, hidden=256):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.norm = kt.RMSNorm(hidden, 1e-6)
        self.mlp = torch.nn.Linear(hidden, hidden)
        self.norm2 = kt.RMSNorm(hidden, 1e-6, casting="gemma", offset=1.0)
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids, labels):
        h = self.embed(ids)
        y, h = self.norm(self.mlp(h), residual=h)
        logits = self.head(self.norm2(y + h))
        return kt.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))


def tiny_batch(seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.randint(0, 1000, (4, 64), device="cuda", generator=g)
    labels = torch.randint(0, 1000, (4, 64), device="cuda", generator=g)
    labels[:, :3] = -100
    return ids, labels


def test_torch_compile_fullgraph_matches_eager():
    torch.manual_seed(0)
    eager = TinyLM().cuda().to(torch.bfloat16)
    compiled_model = copy.deepcopy(eager)
    compiled = torch.compile(compiled_model, fullgraph=True)
    ids, labels = tiny_batch()
    loss_e = eager(ids, labels)
    loss_e.backward()
    loss_c = compiled(ids, labels)
    loss_c.backward()
    assert_close(loss_c, loss_e, 1e-3, 1e-3, "compiled loss")
    for (name, p), q in zip(eager.named_parameters(), compiled_model.parameters()):
        scale = p.grad.abs().max().item()
        assert_close(q.grad, p.grad, 2 ** -6, 2e-2 * scale, f"compiled grad {name}")


def test_cuda_graph_training_step_gives_the_same_bits():
    torch.manual_seed(0)
    model = TinyLM().cuda().to(torch.bfloat16)
    reference = copy.deepcopy(model)
    batches = [tiny_batch(seed) for seed in range(3)]

    def step(m, opt, ids, labels):
        opt.zero_grad(set_to_none=False)
        loss = m(ids, labels)
        loss.backward()
        opt.step()
        return loss

    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for p in reference.parameters():
        p.grad = torch.zeros_like(p)
    ref_losses = [step(reference, ref_opt, *b).detach().clone() for b in batches]

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    static_ids, static_labels = (t.clone() for t in batches[0])
    warm = copy.deepcopy(model)  # kernels built and allocator warmed on a copy, not the model
    warm_opt = torch.optim.SGD(warm.parameters(), lr=0.1)
    for p in warm.parameters():
        p.grad = torch.zeros_like(p)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(warm, warm_opt, static_ids, static_labels)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = step(model, opt, static_ids, static_labels)
    losses = []
    for ids, labels in batches:
        static_ids.copy_(ids)
        static_labels.copy_(labels)
        graph.replay()
        losses.append(static_loss.detach().clone())
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(losses, ref_losses)), (losses, ref_losses)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


# ---- The per-row extras and their reductions (issue 35) ---------------------------------------

def extras_reference(logits, target, softcap=0.0, ignore_index=-100):
    """float64 lse, argmax, entropy and target log-probability of (capped) logits, and the valid
    rows."""
    x = logits.detach().double()
    capped = softcap * torch.tanh(x / softcap) if softcap else x
    lse = torch.logsumexp(capped, -1)
    logp = capped - lse[:, None]
    p = logp.exp()
    entropy = -(p * torch.where(p > 0, logp, 0.0)).sum(-1)
    valid = (target != ignore_index) & (target >= 0) & (target < x.shape[-1])
    x_t = capped.gather(1, torch.where(valid, target, 0).long()[:, None])[:, 0]
    return lse, x.argmax(-1), entropy, torch.where(valid, x_t - lse, 0.0), valid


def check_extras(out, ref, target, logits=None, logit_error=0.0):
    """out's extras against the reference; logits and logit_error (the fused op's): its logits
    may each be that far from the reference's, which moves lse and the log-probability by as
    much, the entropy by up to 2 H times it, and lets the argmax pick any logit that close to
    the largest."""
    lse, argmax, entropy, logprob, valid = ref
    size = 1 + lse.abs().max().item()
    h_err = 2 * entropy.nan_to_num().max().item() * logit_error
    assert isinstance(out, kt.LossOutput)
    assert_close(out.lse, lse, 1e-6, 1e-5 + logit_error, "lse")
    assert_close(out.entropy, entropy, 1e-5, 2e-5 * size + h_err, "entropy")
    assert_close(out.target_logprob, logprob, 1e-6, 1e-5 * size + 2 * logit_error,
                 "target_logprob")
    assert out.predicted.dtype == target.dtype
    if logits is None:
        assert torch.equal(out.predicted.long(), argmax), "predicted tokens"
    else:
        x = logits.detach().double()
        picked = x.gather(1, out.predicted.long()[:, None])[:, 0]
        assert bool((picked >= x.max(-1).values - 2 * logit_error).all()), "predicted tokens"
        argmax = out.predicted.long()
    n = valid.sum()
    assert out.num_tokens.item() == n.item()
    hits = ((argmax == target.long()) & valid).sum().double() / n
    assert_close(out.token_accuracy, hits, 0, 1e-6, "token_accuracy")
    assert_close(out.mean_entropy, entropy[valid].mean(), 1e-5, 1e-5 + h_err, "mean_entropy")
    # The check can fail: an entropy off by twice its bound is rejected.
    with pytest.raises(AssertionError):
        bound = 2e-5 * size + h_err + 1e-5 * entropy.nan_to_num().abs()
        assert_close(out.entropy + 2 * bound, entropy, 1e-5, 2e-5 * size + h_err, "entropy")


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("vocab", [3, 1000, 50257, 128256])
@pytest.mark.parametrize("options", [{}, dict(softcap=10.0, label_smoothing=0.1, z_loss=1e-3),
                                     dict(reduction="none"), dict(inplace_backward=False)])
def test_cross_entropy_extras_match_fp64(dtype, vocab, options):
    rows = 65 if vocab > 50000 else 257
    logits, target = make_ce_inputs(rows, vocab, dtype, scale=8.0 if vocab == 3 else 4.0)
    leaf = logits.clone().requires_grad_()
    out = kt.cross_entropy(leaf.view_as(leaf), target, extras=True, **options)
    ref = extras_reference(logits, target, options.get("softcap") or 0.0)
    check_extras(out, ref, target)
    # The loss and its gradient are the plain call's, bit for bit.
    leaf2 = logits.clone().requires_grad_()
    plain = kt.cross_entropy(leaf2.view_as(leaf2), target, **options)
    assert torch.equal(out.loss, plain)
    up = torch.rand_like(plain) + 0.5
    (g1,) = torch.autograd.grad(out.loss, leaf, up)
    (g2,) = torch.autograd.grad(plain, leaf2, up)
    assert torch.equal(g1, g2)
    if options.get("reduction") == "none":  # -loss is the target's log-probability
        valid = ref[4]
        assert_close(-out.loss[valid], ref[3][valid], 1e-6, 1e-5, "-loss")


def test_cross_entropy_extras_with_class_weights_and_the_z_loss_value():
    logits, target = make_ce_inputs(300, 32000, "bf16")
    weight = torch.rand(32000, device="cuda") * 2
    out = kt.cross_entropy(logits.clone().requires_grad_(), target, weight, z_loss=1e-3,
                           extras=("z_loss", "token_accuracy", "entropy"))
    assert out.lse is None and out.predicted is None and out.target_logprob is None
    lse, argmax, entropy, _, valid = extras_reference(logits, target)
    w_t = weight.double()[torch.where(valid, target, 0)]
    z = torch.where(valid, 1e-3 * lse ** 2 * w_t, 0.0).sum() / torch.where(valid, w_t, 0.0).sum()
    assert_close(out.z_loss, z, 1e-5, 1e-7, "z_loss")
    assert_close(out.entropy, entropy, 1e-5, 1e-4, "entropy")


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
@pytest.mark.parametrize("options", [{}, dict(softcap=8.0, label_smoothing=0.05, z_loss=1e-3),
                                     dict(reduction="none"), dict(class_weight=True)])
def test_linear_cross_entropy_extras_match_fp64(dtype, options):
    options = dict(options)
    h, w, b, target = make_lce_inputs(77, 1001, 64, dtype, True)
    if options.pop("class_weight", False):
        options["class_weight"] = torch.rand(1001, device="cuda") * 2
    up = upstream(options.get("reduction", "mean"), 77)
    hl, wl, bl = (t.clone().requires_grad_() for t in (h, w, b))
    out = kt.linear_cross_entropy(hl, wl, target, bl, extras=True, **options)
    out.loss.backward(up)
    ref_loss, ref_dh, ref_dw, _ = lce_reference(h, w, b, target, up, **options)
    assert_close(out.loss, ref_loss, 1e-5, 1e-5, "loss")
    atol = LCE_ATOL[dtype] * ref_dh.abs().max().item() + 1e-30
    assert_close(hl.grad, ref_dh, 2 * RTOL[dtype], atol, "d_hidden")
    # The op's logits are rounded to the dtype: the reference takes them as the op rounds them.
    logits = F.linear(h.double(), w.double(), b.double()).to(dtype_of(dtype))
    ref = extras_reference(logits, target, options.get("softcap") or 0.0)
    # One rounding of the largest logit (the GEMM's fp32 sum may round the other way).
    error = RTOL[dtype] * logits.double().abs().max().item()
    check_extras(out, ref, target, logits, error)


# ---- apply_to on Hugging Face models -----------------------------------------------------------

def hf_model(kind):
    return small_hf_model(kind, vocab_size=32000, hidden_size=256, max_positions=256,
                          final_softcap=30.0).cuda().to(torch.bfloat16)


@pytest.mark.parametrize("fused", [False, True], ids=["logits", "lm_head_fused"])
@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2"])
def test_apply_to_tracks_the_unpatched_model(kind, fused):
    base = hf_model(kind)
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched, linear_cross_entropy=fused)
    assert changed["model_type"] == kind
    assert len(changed["rms_norm"]) == (2 * 4 + 1 if kind == "gemma2" else 2 * 2 + 1)
    assert changed["loss"].endswith("-> kjit (lm_head fused)" if fused else "-> kjit")
    assert changed["linear_cross_entropy"] is fused
    assert sum(1 for m in patched.modules() if isinstance(m, kt.KjitHFRMSNorm)) == len(
        changed["rms_norm"])
    assert patched.state_dict().keys() == base.state_dict().keys()
    for model in (base, patched):
        model.train()  # the fused path is the training forward's (no dropout in these configs)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (base, patched)]
    g = torch.Generator(device="cuda").manual_seed(1)
    worst = 0.0
    for step in range(50):
        ids = torch.randint(0, 32000, (4, 128), device="cuda", generator=g)
        losses = []
        for model, opt in zip((base, patched), opts):
            opt.zero_grad()
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            opt.step()
            losses.append(out.loss.item())
        # A fused training forward computes no logits; the model's own computes them all.
        assert out.logits.shape == (4, 0 if fused else 128, 32000)
        assert math.isfinite(losses[1])
        worst = max(worst, abs(losses[1] - losses[0]) / abs(losses[0]))
    # bf16 training: the two runs round differently (fp32 loss here, the fp32 copy of the logits
    # there) and drift apart slowly; 2% over 50 steps, where a wrong gradient diverges at once.
    assert worst < 0.02, f"worst relative loss difference {worst}"


def test_apply_to_hands_out_logits_or_none_never_the_gradient():
    base = hf_model("llama")
    ids = torch.randint(0, 32000, (2, 64), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(2))
    labels = ids.clone()
    labels[:, :5] = -100
    base.train()
    expected = base(input_ids=ids, labels=labels)
    for options, seq in (({}, 64), ({"inplace_backward": True}, 0),
                         ({"linear_cross_entropy": True}, 0)):
        patched = copy.deepcopy(base)
        kt.apply_to(patched, rms_norm=False, metrics=True, **options)
        patched.train()
        out = patched(input_ids=ids, labels=labels)
        assert out.logits.shape == (2, seq, 32000), options
        if seq:
            assert torch.equal(out.logits, expected.logits), "the model's logits, untouched"
        out.loss.backward()
        assert abs(out.loss.item() - expected.loss.item()) < 1e-2 * expected.loss.item()
        with torch.no_grad():
            flat = expected.logits.reshape(-1, 32000).double()
            target = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
            valid = target != -100
            logp = torch.log_softmax(flat, -1)
            entropy = (-(logp.exp() * logp).sum(-1))[valid].mean().item()
            accuracy = ((flat.argmax(-1) == target) & valid).sum().item() / valid.sum().item()
        m = out.kjit_metrics
        assert m["num_tokens"].item() == valid.sum().item()
        assert abs(m["entropy"].item() - entropy) < 1e-2 * entropy, (options, m, entropy)
        # (the fused lm_head's logits round differently: a near tie may flip)
        assert abs(m["token_accuracy"].item() - accuracy) <= 2 / valid.sum().item(), options
