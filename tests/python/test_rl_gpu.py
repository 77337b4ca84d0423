"""kjit.torch.log_probs and linear_log_probs on a GPU with kjit's kernels, against float64 torch
autograd through log_softmax: outputs and gradients at temperatures 0.3, 1 and 1.7 for the
log-prob's upstream gradient alone, the entropy's alone and both, three dtypes, odd vocabs, one
row, all rows ignored, in place; forward-only under no_grad; torch.compile(fullgraph=True) and a
CUDA-graph replay of a step. Skips visibly without torch or a GPU."""

import pytest

from conftest import needs_gpu, needs_torch

pytestmark = [needs_torch, needs_gpu]

try:
    import torch
    import torch.nn.functional as F
    import kjit.torch as kt
    # float64 torch autograd through log_softmax, and the scalar of the two upstream gradients
    from test_rl_cpu import _loss as objective, fp32_gradient_slack, reference
except ImportError:
    pass

# The gradient is rounded once to the logits' dtype.
TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def grads(which, rows, device):
    g = torch.Generator(device=device).manual_seed(1)
    return (torch.randn(rows, device=device, generator=g, dtype=torch.float64)
            if which in ("lp", "both") else None,
            torch.randn(rows, device=device, generator=g, dtype=torch.float64)
            if which in ("h", "both") else None)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
@pytest.mark.parametrize("which", ["lp", "h", "both"])
@pytest.mark.parametrize("rows, vocab", [(64, 50257), (1, 1001)])
def test_log_probs_match_float64(dtype, temperature, which, rows, vocab):
    torch.manual_seed(0)
    logits = (torch.randn(rows, vocab, device="cuda") * 3).to(getattr(torch, dtype))
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::7] = -100
    leaf = logits.clone().requires_grad_()
    lp, h = kt.log_probs(leaf, target, temperature, entropy=True)
    ref_leaf = logits.double().requires_grad_()
    r_lp, r_h = reference(ref_leaf, target, temperature)
    torch.testing.assert_close(lp.double(), r_lp, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(h.double(), r_h, rtol=1e-5, atol=1e-4)
    g_lp, g_h = grads(which, rows, "cuda")
    objective(lp, h, g_lp, g_h).backward()
    objective(r_lp, r_h, g_lp, g_h).backward()
    tol = TOL[dtype]
    # Besides the one rounding of the gradient (tol), the fp32 rounding of ln p_j + H, which the
    # entropy's gradient p_j (ln p_j + H) / T multiplies: about 4 u (max|x| + |lse|) absolute
    # (x = z / T), large against entries where ln p_j + H ~ 0 (at T = 0.3 in fp32, 11 of 3.2M
    # entries were off by up to 9.6e-6, relative 3.3e-4). test_rl_cpu.fp32_gradient_slack
    # derives it, and checks it on the kernels' arithmetic emulated in fp32.
    slack = fp32_gradient_slack(logits, target, temperature, g_lp, g_h)
    err = (leaf.grad.double() - ref_leaf.grad).abs()
    allowed = tol * ref_leaf.grad.abs() + tol * 1e-2 + slack
    worst = (err / allowed).argmax()
    assert torch.all(err <= allowed), (
        f"{int((err > allowed).sum())} of {err.numel()} entries off; the worst by "
        f"{err.flatten()[worst].item():.3g} where {allowed.flatten()[worst].item():.3g} is allowed")


def test_all_ignored_forward_only_and_in_place():
    logits = torch.randn(8, 1000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    target = torch.full((8,), -100, device="cuda")
    lp, h = kt.log_probs(logits, target, 0.7, entropy=True)
    assert torch.count_nonzero(lp) == 0 and torch.count_nonzero(h) == 0
    (lp.sum() + h.sum()).backward()
    assert torch.count_nonzero(logits.grad) == 0
    with torch.no_grad():
        lp = kt.log_probs(logits, torch.zeros(8, dtype=torch.long, device="cuda"), 0.7)
    assert not lp.requires_grad and torch.all(lp < 0)
    x = torch.randn(8, 1000, device="cuda", requires_grad=True)
    inter = x * 1.0
    t = torch.randint(0, 1000, (8,), device="cuda")
    kt.log_probs(inter, t, 0.5, inplace_backward=True).sum().backward()
    ref = x.detach().double().requires_grad_()
    reference(ref, t, 0.5)[0].sum().backward()
    torch.testing.assert_close(x.grad.double(), ref.grad, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_log_probs_match_float64(dtype, bias):
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    h = (torch.randn(300, 256, device="cuda") * 0.5).to(dt).requires_grad_()
    w = (torch.randn(32001, 256, device="cuda") * 0.05).to(dt).requires_grad_()
    b = (torch.randn(32001, device="cuda") * 0.1).to(dt).requires_grad_() if bias else None
    t = torch.randint(0, 32001, (300,), device="cuda")
    t[5] = -100
    lp, ent = kt.linear_log_probs(h, w, t, b, temperature=0.7, entropy=True, chunk_rows=128)
    leaves = [x.detach().double().requires_grad_() for x in (h, w) + ((b,) if bias else ())]
    r_lp, r_h = reference(F.linear(*leaves) if bias else leaves[0] @ leaves[1].T, t, 0.7)
    tol = TOL[dtype]
    torch.testing.assert_close(lp.double(), r_lp, rtol=tol, atol=tol)
    torch.testing.assert_close(ent.double(), r_h, rtol=tol, atol=tol)
    up = torch.randn(300, device="cuda", dtype=torch.float64)
    objective(lp, ent, up, up * 0.5).backward()
    objective(r_lp, r_h, up, up * 0.5).backward()
    for x, r in zip((h, w, b), leaves):
        torch.testing.assert_close(x.grad.double(), r.grad, rtol=tol * 4, atol=tol * 1e-1)


def test_torch_compile_and_cuda_graph():
    logits = torch.randn(16, 4099, device="cuda", requires_grad=True)
    t = torch.randint(0, 4099, (16,), device="cuda")

    def step(x):
        lp, h = kt.log_probs(x, t, 0.7, entropy=True)
        return (lp * 2).sum() + h.sum()

    eager = torch.autograd.grad(step(logits), logits)[0]
    compiled = torch.compile(step, fullgraph=True)
    torch.testing.assert_close(torch.autograd.grad(compiled(logits), logits)[0], eager)
    static = logits.detach().clone().requires_grad_()
    step(static).backward()  # builds the kernels before the capture
    static.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = step(static)
        loss.backward()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static.grad, eager)
