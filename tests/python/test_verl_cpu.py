"""kjit.torch.integrations.verl.linear_cross_entropy, verl's fused lm_head + log-probs + entropy, on
the CPU (kjit's kernels replaced by the float64 stand-ins of test_rl_cpu.py) against a float64 torch
implementation of verl's definitions (verl/utils/kernel: logits = hidden @ weight.T / T, logprobs =
-cross_entropy(logits, labels, "none"), reduced by sum or mean over every token, entropy =
logsumexp(logits) - sum softmax(logits) * logits): outputs, shapes and the gradients of hidden and
weight from both outputs. verl itself is not installed here."""

import pytest

from conftest import needs_torch

pytestmark = needs_torch

try:
    import torch
    import torch.nn.functional as F
    from kjit.torch.integrations.verl import linear_cross_entropy
    from test_rl_cpu import launches  # noqa: F401 (the fixture: kernels as float64 stand-ins)
except ImportError:
    pass


def verl_reference(hidden, weight, labels, temperature, reduction):
    logits = (hidden.reshape(-1, hidden.shape[-1]) @ weight.T) / temperature
    logprobs = -F.cross_entropy(logits, labels.reshape(-1), reduction="none")
    p = torch.softmax(logits, -1)
    entropy = torch.logsumexp(logits, -1) - (p * logits).sum(-1)
    if reduction == "sum":
        logprobs = logprobs.sum()
    elif reduction == "mean":
        logprobs = logprobs.mean()
    else:
        logprobs = logprobs.view(labels.shape)
    return logprobs, entropy.view(labels.shape)


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
def test_matches_verls_definitions(launches, reduction, temperature):
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 5, 8, generator=g).double().float()
    weight = (torch.randn(13, 8, generator=g) * 0.5).float()
    labels = torch.randint(0, 13, (2, 5), generator=g)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    logprobs, entropy = linear_cross_entropy(h, w, labels, temperature, reduction)
    rh, rw = hidden.double().requires_grad_(), weight.double().requires_grad_()
    ref_lp, ref_h = verl_reference(rh, rw, labels, temperature, reduction)
    assert logprobs.shape == ref_lp.shape and entropy.shape == labels.shape
    torch.testing.assert_close(logprobs.double(), ref_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy.double(), ref_h, rtol=1e-5, atol=1e-5)
    up = torch.randn(entropy.shape, generator=g, dtype=torch.float64)
    ((logprobs.double() * 2).sum() + (entropy.double() * up).sum()).backward()
    ((ref_lp * 2).sum() + (ref_h * up).sum()).backward()
    torch.testing.assert_close(h.grad.double(), rh.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(w.grad.double(), rw.grad, rtol=1e-4, atol=1e-5)


def test_the_old_module_path_gives_the_same_function():
    import kjit.torch.verl
    assert kjit.torch.verl.linear_cross_entropy is linear_cross_entropy


def test_refuses_what_it_does_not_compute(launches):
    h, w, t = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(NotImplementedError, match="dist_process_group"):
        linear_cross_entropy(h, w, t, 1.0, "none", object())
    with pytest.raises(ValueError, match="reduction"):
        linear_cross_entropy(h, w, t, 1.0, "avg")
    assert not launches


# Issue 45 (messages): a reduction that is not a str raised AttributeError ('int' object has no
# attribute 'lower'); a long one was echoed whole.
def test_a_bad_reduction_names_the_type_expected_and_is_quoted_cut(launches):
    h, w, t = torch.randn(3, 4), torch.randn(5, 4), torch.zeros(3, dtype=torch.long)
    with pytest.raises(TypeError, match=r"reduction must be a str, one of .*, got int 3$"):
        linear_cross_entropy(h, w, t, 1.0, 3)
    with pytest.raises(ValueError, match=r"got str 'x{59}\.\.\. \(100002 characters\)$"):
        linear_cross_entropy(h, w, t, 1.0, "x" * 100000)
    with pytest.raises(TypeError, match=r"temperature must be a number \(float\), got str"):
        linear_cross_entropy(h, w, t, "1.0", "none")
    assert not launches
