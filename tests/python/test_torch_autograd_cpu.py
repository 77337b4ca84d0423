"""kjit.torch.linear_cross_entropy's autograd wiring without a GPU: the two kernels replaced by a
float64 torch implementation of what they compute (include/kjit/linear_cross_entropy.h) on CPU
tensors, so that which launch runs with which gradients asked for, how the backward applies the
upstream gradient, and the reduction "none" path are checked against F.cross_entropy wherever torch
is installed. (tests/python/test_torch_gpu.py checks the real kernels.)"""

import pytest

from conftest import needs_torch

pytestmark = needs_torch

try:
    import torch
    import torch.nn.functional as F
    import kjit.torch as kt
    from kjit._loss_options import LossOptions
    from kjit.torch import _kernels, functional
except ImportError:
    pass


def _logits(h, w, b, softcap):
    logits = F.linear(h, w, b)
    return softcap * torch.tanh(logits / softcap) if softcap else logits


def _loss(h, w, t, b, ignore_index, reduction, label_smoothing, z_loss, softcap,
          accumulation="fp32", class_weight=None):
    logits = _logits(h, w, b, softcap)
    cw = None if class_weight is None else class_weight.to(logits.dtype)
    per_row = F.cross_entropy(logits, t.long(), weight=cw, ignore_index=ignore_index,
                              reduction="none", label_smoothing=label_smoothing)
    valid = t != ignore_index
    w_t = torch.ones_like(per_row) if cw is None else cw[torch.where(valid, t, 0)]
    z = z_loss * torch.logsumexp(logits, dim=-1) ** 2 * w_t
    per_row = per_row + torch.where(valid, z, torch.zeros_like(z))
    if reduction == "none":
        return per_row
    return per_row.sum() if reduction == "sum" else per_row.sum() / torch.where(valid, w_t, 0).sum()


def _per_row(h, w, t, b, argmax, entropy, logprob, ignore_index, softcap):
    """lse and the extras the kernels write, in float64 (empty where not asked, and the lse too
    when nothing is, as the fused op's)."""
    with torch.no_grad():
        logits = _logits(h.double(), w.double(), None if b is None else b.double(), softcap)
        lse = torch.logsumexp(logits, dim=-1)
        logp = logits - lse[:, None]
        valid = t != ignore_index
        x_t = logits.gather(1, torch.where(valid, t, 0).long()[:, None])[:, 0]
        empty = torch.empty(0)
        return (lse.float() if argmax or entropy or logprob else empty,
                logits.argmax(-1).to(t.dtype) if argmax else empty.to(t.dtype),
                -(logp.exp() * logp).sum(-1).float() if entropy else empty,
                torch.where(valid, x_t - lse, 0.0).float() if logprob else empty)


@pytest.fixture
def launches(monkeypatch):
    """The kernels as torch code on the CPU; returns the launches made, in order."""
    made = []

    def forward(h, w, t, b, cw, argmax, entropy, logprob, *options):
        made.append(("forward",))
        with torch.no_grad():
            loss = _loss(h.double(), w.double(), t, None if b is None else b.double(), *options,
                         class_weight=cw).float()
        return (loss, *_per_row(h, w, t, b, argmax, entropy, logprob, options[0], options[4]))

    def forward_backward(h, w, t, b, cw, grad_output, argmax, entropy, logprob, d_h, d_w, d_b,
                         *options):
        made.append(("forward_backward", d_h, d_w, d_b, grad_output is not None))
        inputs = [x.detach().double().requires_grad_(wanted) if x is not None else None
                  for x, wanted in ((h, d_h), (w, d_w), (b, d_b))]
        with torch.enable_grad():
            loss = _loss(inputs[0], inputs[1], t, inputs[2], *options, class_weight=cw)
            up = torch.ones_like(loss) if grad_output is None else grad_output.double().reshape(
                loss.shape)
            wanted = [x for x in inputs if x is not None and x.requires_grad]
            grads = iter(torch.autograd.grad(loss, wanted, up))
        out = [next(grads).to(x.dtype) if x is not None and x.requires_grad else
               torch.empty(0, dtype=h.dtype) for x in inputs]
        return (loss.detach().float(),
                *_per_row(h, w, t, b, argmax, entropy, logprob, options[0], options[4]), *out)

    def rescale(grad, which, grad_output, applied, *spec_and_options):
        g = grad_output.double().reshape(())
        a = torch.ones((), dtype=torch.float64) if applied is None else applied.double().reshape(())
        made.append(("rescale", which, g.item() != a.item()))
        if g != a:  # (the kernel's test on the device)
            grad.copy_(grad.double() * (g / a))

    monkeypatch.setattr(_kernels, "linear_cross_entropy_forward", forward)
    monkeypatch.setattr(_kernels, "linear_cross_entropy_forward_backward", forward_backward)
    monkeypatch.setattr(_kernels, "linear_cross_entropy_rescale_", rescale)
    monkeypatch.setattr(functional, "check_on_one_gpu", lambda *named: None)
    return made


def _inputs(rows=6, vocab=11, hidden=5, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g)
    w = torch.randn(vocab, hidden, generator=g)
    b = torch.randn(vocab, generator=g) if bias else None
    t = torch.randint(0, vocab, (rows,), generator=g)
    t[2] = -100
    return h, w, t, b


def _reference(h, w, t, b, up, **options):
    leaves = [x.detach().double().requires_grad_() if x is not None else None for x in (h, w, b)]
    opts = dict(ignore_index=-100, reduction="mean", label_smoothing=0.0, z_loss=0.0,
                softcap=0.0)
    class_weight = options.pop("class_weight", None)
    opts.update(options)
    loss = _loss(leaves[0], leaves[1], t, leaves[2], *opts.values(), class_weight=class_weight)
    loss.backward(up.double())
    return loss.detach(), [x.grad if x is not None else None for x in leaves]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("options", [{}, dict(label_smoothing=0.1, z_loss=1e-3, softcap=3.0),
                                     dict(label_smoothing=0.1, z_loss=1e-3, class_weight="random")])
def test_gradients_match_torch_for_every_reduction(launches, reduction, options):
    h, w, t, b = _inputs()
    leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    if options.get("class_weight") == "random":
        options = dict(options, class_weight=torch.rand(11) + 0.5)
    up = torch.rand(6 if reduction == "none" else ()) + 0.5
    loss = kt.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], reduction=reduction,
                                   **options)
    loss.backward(up)
    options = dict(options)
    ref_loss, ref_grads = _reference(h, w, t, b, up, reduction=reduction, **options)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
    for leaf, ref in zip(leaves, ref_grads):
        assert leaf.grad.dtype == leaf.dtype
        torch.testing.assert_close(leaf.grad.double(), ref, rtol=1e-5, atol=1e-6)
    if reduction == "none":  # the forward, then the fused pass with the per-row gradient
        assert launches == [("forward",), ("forward_backward", True, True, True, True)]
    else:  # the gradients in the forward, for upstream 1, rescaled by the backward
        assert launches == [("forward_backward", True, True, True, False),
                            ("rescale", "d_hidden", True), ("rescale", "d_weight", True),
                            ("rescale", "d_bias", True)]


@pytest.mark.parametrize("declared, upstream", [(None, 1.0), (0.25, 0.25), (0.25, 2.0)])
def test_grad_scale_is_the_upstream_gradient_the_forward_computes_for(launches, declared,
                                                                      upstream):
    h, w, t, b = _inputs()
    leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    loss = kt.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], reduction="sum",
                                   grad_scale=declared)
    loss.backward(torch.tensor(upstream))
    _, ref_grads = _reference(h, w, t, b, torch.tensor(upstream), reduction="sum")
    for leaf, ref in zip(leaves, ref_grads):
        torch.testing.assert_close(leaf.grad.double(), ref, rtol=1e-5, atol=1e-6)
    # The forward is told the scale; the backward's rescale changes the gradients only when the
    # upstream gradient is another.
    assert launches[0] == ("forward_backward", True, True, True, declared is not None)
    differs = upstream != (1.0 if declared is None else declared)
    assert launches[1:] == [("rescale", which, differs)
                            for which in ("d_hidden", "d_weight", "d_bias")]


def test_grad_scale_is_refused_for_reduction_none(launches):
    h, w, t, b = _inputs()
    with pytest.raises(ValueError, match="grad_scale is for reduction 'sum' and 'mean'"):
        kt.linear_cross_entropy(h, w, t, b, reduction="none", grad_scale=0.5)
    assert not launches


@pytest.mark.parametrize("requires, expected", [
    ((True, False, False), [("forward_backward", True, False, False, False)]),
    ((False, True, False), [("forward_backward", False, True, False, False)]),
    ((False, False, True), [("forward_backward", False, False, True, False)]),
    ((False, True, True), [("forward_backward", False, True, True, False)]),
    ((False, False, False), [("forward",)]),
])
def test_only_the_gradients_required_are_computed(launches, requires, expected):
    h, w, t, b = _inputs()
    leaves = [x.clone().requires_grad_(r) for x, r in zip((h, w, b), requires)]
    loss = kt.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2])
    assert launches == expected
    if not any(requires):
        assert not loss.requires_grad
        return
    loss.backward()
    _, ref_grads = _reference(h, w, t, b, torch.ones(()))
    for leaf, r, ref in zip(leaves, requires, ref_grads):
        if r:
            torch.testing.assert_close(leaf.grad.double(), ref, rtol=1e-5, atol=1e-6)
        else:
            assert leaf.grad is None


def test_no_grad_runs_the_forward_alone(launches):
    h, w, t, b = _inputs()
    for x in (h, w, b):
        x.requires_grad_()
    with torch.no_grad():
        kt.linear_cross_entropy(h, w, t, b)
    assert launches == [("forward",)]


def test_no_bias_and_backward_once(launches):
    h, w, t, _ = _inputs(bias=False)
    hl = h.clone().requires_grad_()
    loss = kt.linear_cross_entropy(hl, w, t)
    assert launches == [("forward_backward", True, False, False, False)]
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        loss.backward()


def test_a_strided_bias_gets_its_gradient(launches):
    h, w, t, _ = _inputs()
    wide = torch.randn(11, 2, requires_grad=True)
    loss = kt.linear_cross_entropy(h, w, t, wide[:, 0])
    loss.backward()
    _, (_, _, ref_db) = _reference(h, w, t, wide[:, 0].detach(), torch.ones(()))
    torch.testing.assert_close(wide.grad[:, 0].double(), ref_db, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(wide.grad[:, 1]) == 0


def test_extras_come_from_the_same_launch_and_reduce_over_the_valid_rows(launches):
    h, w, t, b = _inputs(rows=9)
    t[5] = -100
    leaves = [x.clone().requires_grad_() for x in (h, w, b)]
    out = kt.linear_cross_entropy(leaves[0], leaves[1], t, leaves[2], extras=True, z_loss=1e-2)
    assert isinstance(out, kt.LossOutput)
    assert launches == [("forward_backward", True, True, True, False)]  # one pass, all of it
    ref_loss, _ = _reference(h, w, t, b, torch.ones(()), z_loss=1e-2)
    torch.testing.assert_close(out.loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
    logits = F.linear(h.double(), w.double(), b.double())
    valid = t != -100
    lse = torch.logsumexp(logits, -1)
    p = torch.softmax(logits, -1)
    entropy = -(p * p.log()).sum(-1)
    predicted = logits.argmax(-1)
    assert out.predicted.dtype == t.dtype and torch.equal(out.predicted, predicted)
    torch.testing.assert_close(out.lse.double(), lse, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out.entropy.double(), entropy, rtol=1e-6, atol=1e-6)
    logprob = torch.where(valid, logits.gather(1, torch.where(valid, t, 0)[:, None])[:, 0] - lse,
                          0.0)
    torch.testing.assert_close(out.target_logprob.double(), logprob, rtol=1e-6, atol=1e-6)
    n = valid.sum()
    assert out.num_tokens.item() == n.item() == 7
    assert out.token_accuracy.dtype == torch.float32
    torch.testing.assert_close(out.token_accuracy.double(),
                               ((predicted == t) & valid).sum().double() / n)
    torch.testing.assert_close(out.mean_entropy.double(), entropy[valid].mean(), rtol=1e-6,
                               atol=1e-6)
    torch.testing.assert_close(out.z_loss.double(), (1e-2 * lse[valid] ** 2).mean(), rtol=1e-5,
                               atol=1e-7)
    # The loss alone is differentiable; the extras are not.
    out.loss.backward()
    assert all(x.grad is not None for x in leaves)
    assert not any(getattr(out, f).requires_grad for f in kt.LossOutput._fields[1:])


def test_asking_for_some_extras_computes_only_what_they_need(launches, monkeypatch):
    seen = []
    real = _kernels.linear_cross_entropy_forward

    def spy(h, w, t, b, cw, argmax, entropy, logprob, *options):
        seen.append((argmax, entropy, logprob))
        return real(h, w, t, b, cw, argmax, entropy, logprob, *options)

    monkeypatch.setattr(_kernels, "linear_cross_entropy_forward", spy)
    h, w, t, b = _inputs()
    out = kt.linear_cross_entropy(h, w, t, b, extras=("token_accuracy",))
    assert seen[-1] == (True, False, False)
    assert out.token_accuracy is not None and out.entropy is None and out.predicted is None
    kt.linear_cross_entropy(h, w, t, b, extras="mean_entropy")
    assert seen[-1] == (False, True, False)
    out = kt.linear_cross_entropy(h, w, t, b, extras=["lse"])
    assert seen[-1] == (False, False, True) and out.lse.shape == (6,)  # a row output: the lse
    assert torch.is_tensor(kt.linear_cross_entropy(h, w, t, b))  # the plain call: the loss
    with pytest.raises(ValueError, match="unknown 'accuracy'"):
        kt.linear_cross_entropy(h, w, t, b, extras=("accuracy",))


def test_reduction_none_keeps_per_row_upstream_gradients_with_extras(launches):
    h, w, t, b = _inputs()
    hl = h.clone().requires_grad_()
    out = kt.linear_cross_entropy(hl, w, t, b, reduction="none", extras=True)
    up = torch.rand(6) + 0.5
    out.loss.backward(up)
    _, (ref_dh, _, _) = _reference(h, w, t, b, up, reduction="none")
    torch.testing.assert_close(hl.grad.double(), ref_dh, rtol=1e-5, atol=1e-6)
    # (-loss is the target's log-probability, with its gradient, where no option changes it)
    valid = t != -100
    torch.testing.assert_close(-out.loss[valid], out.target_logprob[valid], rtol=1e-6, atol=1e-6)


def test_lse_square_scale_still_works_and_warns(launches):
    h, w, t, b = _inputs()
    with pytest.warns(DeprecationWarning, match="now z_loss"):
        old = kt.linear_cross_entropy(h, w, t, b, lse_square_scale=1e-2)
    torch.testing.assert_close(old, kt.linear_cross_entropy(h, w, t, b, z_loss=1e-2))
    with pytest.raises(ValueError, match="z_loss alone"), pytest.warns(DeprecationWarning):
        kt.linear_cross_entropy(h, w, t, b, lse_square_scale=1e-2, z_loss=1e-3)
    with pytest.warns(DeprecationWarning):
        assert kt.LinearCrossEntropyLoss(lse_square_scale=0.5).z_loss == 0.5


def test_the_weight_gradient_accumulation_is_chosen_and_checked(launches, monkeypatch):
    specs = []

    class Runtime:
        def linear_cross_entropy(self, **spec):
            specs.append(spec)

    monkeypatch.setattr(_kernels, "runtime", lambda device: Runtime())
    monkeypatch.setattr(_kernels, "_ops", {})
    for accumulation in ("output_dtype", "fp32"):
        _kernels.linear_cross_entropy_op(*_inputs()[:3], True, True, None, (False, False, False),
                                         LossOptions(), accumulation)
    assert [s["weight_grad_accumulation"] for s in specs] == ["output_dtype", "fp32"]
    with pytest.raises(ValueError, match="weight_grad_accumulation"):
        kt.linear_cross_entropy(*_inputs(), weight_grad_accumulation="bf16")
