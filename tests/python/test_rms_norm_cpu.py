"""kjit.torch.rms_norm (and the RMSNorm modules apply_to installs) on inputs of any strides, without
a GPU: its two kernels replaced by torch stand-ins on CPU tensors that see their tensors as the real
launches do (kjit.torch._kernels.matrix_shape, which raises for a view whose rows have no single
stride), so that what reaches the kernels is checked here. The real kernels: test_torch_gpu.py and
test_hf_families_cpu.py's GPU tests."""

import copy
import importlib.util

import pytest

from conftest import needs_torch

pytestmark = needs_torch

try:
    import torch
    import kjit.torch as kt
    from kjit.torch import _kernels, functional
    from kjit.torch.integrations import hf
except ImportError:
    pass


def _reference(x, weight, eps, offset):
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (offset + weight.double())


@pytest.fixture
def norm_kernels_on_cpu(monkeypatch):
    """rms_norm_forward and rms_norm_backward as torch code on CPU tensors, each first seeing its
    tensors as the launch does (matrix_shape); returns the tensors they got, by name."""
    seen = []

    def as_launched(**named):
        for what, t in named.items():
            if t is not None:
                _kernels.matrix_shape(t, what)
        seen.append(named)

    def forward(x, weight, residual, eps, offset, casting):
        as_launched(x=x, weight=weight, residual=residual)
        h = x if residual is None else x + residual
        h32 = h.float()
        rstd = torch.rsqrt(h32.pow(2).mean(-1) + eps)
        normed = h32 * rstd[..., None]
        if casting == "gemma":
            y = (normed * (offset + weight.float())).to(x.dtype)
        else:
            y = normed.to(x.dtype) * (offset + weight)
        # (the kernels write new contiguous tensors)
        return (y.contiguous(), rstd.contiguous(),
                h.contiguous() if residual is not None else x.new_empty(0))

    def backward(dy, x, weight, rstd, dresidual, eps, offset, casting, fused_residual):
        as_launched(dy=dy, x=x, weight=weight, dresidual=dresidual)
        with torch.enable_grad():
            x64 = x.detach().double().requires_grad_()
            w64 = weight.detach().double().requires_grad_()
            dx, dw = torch.autograd.grad(_reference(x64, w64, eps, offset), (x64, w64),
                                         dy.double())
        if dresidual is not None:
            dx = dx + dresidual.double()
        return dx.to(x.dtype).contiguous(), dw.to(weight.dtype)

    monkeypatch.setattr(_kernels, "rms_norm_forward", forward)
    monkeypatch.setattr(_kernels, "rms_norm_backward", backward)
    monkeypatch.setattr(functional, "check_on_one_gpu", lambda *named: None)
    monkeypatch.setattr(hf, "_not_for_kjit", lambda t: None)
    return seen


# name -> (the leaf's shape, the view of it rms_norm gets): views the kernels cannot take as
# they are
_VIEWS = {
    # Gemma 3's q/k norm: [batch, seq, heads, head_dim] transposed to [batch, heads, seq, head_dim]
    "transposed_heads": ((2, 12, 4, 8), lambda t: t.transpose(1, 2)),
    "strided_last_dim": ((8, 6), lambda t: t.t()),
    "rows_without_one_stride": ((3, 4, 16), lambda t: t[:, :, :8].transpose(0, 1)),
    "broadcast_rows": ((1, 8), lambda t: t.expand(5, 8)),
}


@pytest.mark.parametrize("view", sorted(_VIEWS))
def test_any_strided_input_is_taken_with_its_gradient(norm_kernels_on_cpu, view):
    shape, view_of = _VIEWS[view]
    g = torch.Generator().manual_seed(3)
    leaf = torch.randn(shape, generator=g).requires_grad_()
    x = view_of(leaf)
    assert not _kernels.is_matrix(x), "a view the kernels cannot take as it is"
    weight = (torch.rand(x.shape[-1], generator=g) + 0.5).requires_grad_()
    y = kt.rms_norm(x, weight, 1e-6, casting="gemma", offset=1.0)
    assert y.shape == x.shape
    assert norm_kernels_on_cpu[0]["x"].is_contiguous()  # copied: what the kernels can take
    up = torch.randn(y.shape, generator=g)
    (y * up).sum().backward()
    leaf64 = leaf.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    want = _reference(view_of(leaf64), w64, 1e-6, 1.0)
    (want * up.double()).sum().backward()
    torch.testing.assert_close(y.double(), want, rtol=1e-6, atol=1e-6)
    # The gradient reaches the leaf through the view: its shape and strides, torch's values.
    assert leaf.grad.shape == leaf.shape and leaf.grad.stride() == leaf.stride()
    torch.testing.assert_close(leaf.grad.double(), leaf64.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), w64.grad, rtol=1e-6, atol=1e-6)


def test_rows_of_one_stride_reach_the_kernels_without_a_copy(norm_kernels_on_cpu):
    x = torch.randn(3, 5, 16)[:, :, :8]  # rows 16 elements apart
    kt.rms_norm(x, torch.ones(8))
    assert norm_kernels_on_cpu[0]["x"] is x


def test_a_strided_residual_is_taken_too(norm_kernels_on_cpu):
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, 12, 4, 8, generator=g).transpose(1, 2).requires_grad_()
    residual = torch.randn(2, 12, 4, 8, generator=g).transpose(1, 2).requires_grad_()
    weight = torch.rand(8, generator=g) + 0.5
    y, h = kt.rms_norm(x, weight, residual=residual)
    torch.testing.assert_close(h, x + residual)
    torch.testing.assert_close(y.double(), _reference(x + residual, weight, 1e-6, 0.0),
                               rtol=1e-6, atol=1e-6)
    assert all(t is None or t.is_contiguous() for t in norm_kernels_on_cpu[0].values()
               if t is not weight)
    (y.sum() + h.sum()).backward()
    assert x.grad.stride() == x.stride() and residual.grad.stride() == residual.stride()
    torch.testing.assert_close(x.grad, residual.grad)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed")
def test_gemma3s_qk_norm_on_a_transposed_view_takes_the_models_step(norm_kernels_on_cpu):
    """The failure the GPU run met (matrix_shape's ValueError inside the patched q/k norm): the
    training step of a tiny Gemma 3 with apply_to's norms is the unpatched model's."""
    from test_hf_families_cpu import batch, family_model, step
    base = family_model("gemma3_text", torch.float32).train()
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched, cross_entropy=False, strict=True)
    assert any(name.endswith("q_norm") for name in changed["rms_norm"])
    strided = []
    for name, module in patched.named_modules():
        if name.endswith(("q_norm", "k_norm")):
            module.register_forward_pre_hook(
                lambda module, args: strided.append(not _kernels.is_matrix(args[0])))
    inputs = batch(3)
    want = step(base, **inputs)
    got = step(patched, **inputs)
    assert strided and all(strided), "the q/k norms get views the kernels cannot take as they are"
    torch.testing.assert_close(got[0].loss, want[0].loss, rtol=1e-5, atol=0)
    assert got[1].keys() == want[1].keys()
    for name, grad in got[1].items():
        torch.testing.assert_close(grad, want[1][name], rtol=1e-4, atol=1e-6, msg=name)
