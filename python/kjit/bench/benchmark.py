"""`python -m kjit.bench`: kjit through autograd beside the op itself (the C API, no autograd),
PyTorch eager and torch.compile, on the same inputs in one process, with the device-to-device copy
bandwidth measured in the same run. Prints a table and writes JSON (--json PATH).

    python -m kjit.bench --json bench.json
    python -m kjit.bench --case ce:16384x128256 --case norm:16384x4096

Each row has three times per call: "us", CUDA events around --iters calls made back to back
after a warm-up, which counts the host's overhead wherever the GPU cannot hide it (small shapes);
"gpu_us", the same calls with the host ahead: a sleep kernel holds the stream until every call is
queued, so the GPU runs them without waiting for the host, as it does in a training step whose
GEMMs keep it busy; and "host_us", the host's (CPU) time to issue one call. The "CUDA graph" row
replays the autograd step captured in a graph. Peak extra memory is torch's peak allocation
beyond the inputs during one iteration. Bandwidth ratios are to the copy, from "gpu_us".

The lm_head + loss case (lce:, issue 20) is GEMM-bound, so it is measured against the three GEMMs
alone instead of the copy, in milliseconds and TFLOP/s; an implementation that runs out of memory
there is a result (a row saying so), not an error (bench_linear_cross_entropy). The hf: case is a
whole Hugging Face training step (bench_hf_step), timed the same way.
"""

from __future__ import annotations

import argparse
import copy
import gc
import importlib.util
import json
import re
import sys
import time
from typing import Optional

import torch
import torch.nn.functional as F

import kjit
import kjit.torch as kt
from kjit._loss_options import LossOptions
from kjit.torch import _kernels

DEFAULT_CASES = ["ce:16384x128256", "ce:4096x128256", "ce:256x128256", "norm:16384x4096",
                 "norm:256x4096", "lce:8192x4096x128256", "hf:4x2048", "hf:4x8192"]
CASE_SHAPES = {"ce": "ROWSxVOCAB", "norm": "ROWSxHIDDEN", "lce": "ROWSxHIDDENxVOCAB",
               "hf": "BATCHxSEQ", "extras": "ROWSxVOCAB", "lce-extras": "ROWSxHIDDENxVOCAB",
               "rl": "ROWSxHIDDENxVOCAB", "rl-logits": "ROWSxVOCAB"}
CASES_HELP = """cases:
  ce:ROWSxVOCAB         cross-entropy forward + backward on bf16 logits
  norm:ROWSxHIDDEN      RMSNorm forward + backward, bf16
  lce:ROWSxHIDDENxVOCAB lm_head + cross-entropy forward + backward, bf16 (LLaMA 3's lm_head:
                        lce:8192x4096x128256): kjit.torch.linear_cross_entropy beside eager
                        F.cross_entropy(hidden @ weight.T, target) with bf16 and with .float()
                        logits, torch.compile of the bf16 one and the three GEMMs alone; time,
                        TFLOP/s (6 * rows * hidden * vocab), ratio to the GEMMs, peak extra
                        memory, a row saying "out of memory" for one that does not fit, and
                        kjit's loss and gradients checked against eager's first
  hf:BATCHxSEQ          a Hugging Face training step (forward + backward, labels = inputs) of a
                        two-layer LLaMA 3.1 8B (its hidden size, heads, MLP and vocab, bf16,
                        SDPA attention): as transformers runs it, with kjit.torch.apply_to (the
                        default: the gradient in a buffer of its own, logits intact), with
                        inplace_backward=True (gradient over the logits, which the output
                        then omits), with metrics=True, and with linear_cross_entropy=True
                        (with and without metrics); ms per step, peak extra memory and the
                        losses (needs transformers). The default's cost is its row against
                        the inplace_backward=True row.
  extras:ROWSxVOCAB     cross-entropy forward + backward on bf16 logits, plain against the
                        extras a trainer logs (lse, token accuracy, mean entropy: the argmax and
                        entropy kernels), through kjit.torch and as the bare op (C API)
  lce-extras:ROWSxHIDDENxVOCAB  the same for linear_cross_entropy (issue 35's shapes:
                        extras:16384x128256 and lce-extras:8192x4096x128256)
  rl:ROWSxHIDDENxVOCAB  RL heads from hidden states (issue 47: rl:8192x4096x151936), bf16, T 0.7:
                        kjit.torch.linear_log_probs (log-probs + entropy, backward from both
                        upstream gradients; and forward only) beside eager (logits / T,
                        log_softmax in fp32, gather, entropy), torch.compile of it, TRL's
                        ChunkedLogProbFunction when trl is installed, and the GEMMs alone (three
                        for a step, the logits GEMM for a forward); kjit checked against eager
                        first
  rl-logits:ROWSxVOCAB  RL heads from bf16 logits (issue 47: rl-logits:16384x151936):
                        kjit.torch.log_probs forward + backward (in place) and forward only,
                        beside eager and torch.compile; "of copy" counts the logits read and the
                        gradient written once, as the loss's does"""


def parse_case(case: str) -> tuple:
    """(kind, sizes) of "kind:AxB[xC]", checked before any GPU work so that a typo in the last
    --case does not surface after the others have run."""
    kind, _, shape = case.partition(":")
    try:
        sizes = tuple(int(v) for v in shape.split("x"))
    except ValueError:
        sizes = ()
    if (kind not in CASE_SHAPES or len(sizes) != CASE_SHAPES[kind].count("x") + 1
            or min(sizes) < 1):
        forms = ", ".join(f"{k}:{v}" for k, v in CASE_SHAPES.items())
        raise ValueError(f"--case {case}: expected one of {forms}, with positive sizes")
    return kind, sizes


def timed(fn, iters: int, warmup: int = 3) -> dict:
    """{"us", "gpu_us", "host_us"} of fn (the module's docstring defines them)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    back_to_back_us = start.elapsed_time(end) * 1000.0 / iters
    hold_us = 2 * iters * back_to_back_us + 1000
    for _ in range(5):
        torch.cuda._sleep(int(hold_us * _cycles_per_us()))
        start.record()
        began = time.perf_counter()
        for _ in range(iters):
            fn()
        host_us = (time.perf_counter() - began) * 1e6 / iters
        # The start event still pending means the GPU was held until the last call was queued.
        held = not start.query()
        end.record()
        torch.cuda.synchronize()
        if held:
            return {"us": back_to_back_us, "gpu_us": start.elapsed_time(end) * 1000.0 / iters,
                    "host_us": host_us}
        # Too few cycles held, or more launches than the driver queues without blocking the
        # host (eager torch launches a dozen kernels a step): fewer calls, held longer.
        iters = max(iters // 2, 2)
        hold_us = 4 * iters * host_us + 1000
    raise RuntimeError("kjit.bench: the host could not queue the calls ahead of the GPU")


_cycles = []


def _cycles_per_us() -> float:
    """GPU clock cycles per microsecond, as torch.cuda._sleep counts them (measured once)."""
    if not _cycles:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _cycles.append(10_000_000 / (start.elapsed_time(end) * 1000.0))
    return _cycles[0]


def graphed(fn):
    """fn captured into a CUDA graph (after a warm-up on a side stream): its replay is fn without
    the host's per-call overhead, i.e. the GPU time of what fn launches."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def peak_extra_bytes(fn) -> int:
    fn()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def copy_bandwidth() -> float:
    """Device-to-device copy, bytes read plus written per second."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = timed(lambda: dst.copy_(src), 20)["gpu_us"]
    return 2 * src.numel() / (us * 1e-6)


def _row(name, times, moved_bytes, copy_bw, extra):
    row = {"impl": name, **{k: round(v, 2) for k, v in times.items()},
           "bandwidth_ratio": round(moved_bytes / (times["gpu_us"] * 1e-6) / copy_bw, 4),
           "peak_extra_bytes": extra}
    return row


def bench_cross_entropy(rows: int, vocab: int, iters: int, copy_bw: float) -> list:
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device="cuda")
    moved = 2 * rows * vocab * logits.element_size()  # read the logits once, write the gradient

    def kjit_autograd():
        # The op sees an intermediate, as it sees lm_head's output: the gradient goes in place.
        loss = kt.cross_entropy(logits.view_as(logits), target)
        torch.autograd.grad(loss, logits)

    op = _kernels.cross_entropy_op(logits, target, LossOptions())
    loss = torch.empty((), device="cuda")
    workspace = torch.empty(op.workspace_bytes(rows), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    matrix = _kernels.as_matrix(logits.detach(), "logits")
    fields = dict(logits=matrix, targets=_kernels.as_index(target, "target"),
                  loss=_kernels.as_vector(loss), grad=matrix, workspace=workspace.data_ptr(),
                  workspace_bytes=workspace.numel())

    def kjit_op():
        op.forward_backward(stream, **fields)

    def eager():
        torch.autograd.grad(F.cross_entropy(logits.view_as(logits), target), logits)

    compiled_ce = torch.compile(F.cross_entropy)

    def compiled():
        torch.autograd.grad(compiled_ce(logits.view_as(logits), target), logits)

    results = []
    for name, fn in (("kjit.torch (autograd)", kjit_autograd),
                     ("kjit.torch (autograd, CUDA graph)", graphed(kjit_autograd)),
                     ("kjit op (C API)", kjit_op), ("torch eager", eager),
                     ("torch.compile", compiled)):
        n = iters if rows * vocab < 1 << 30 else max(iters // 4, 5)
        results.append(_row(name, timed(fn, n), moved, copy_bw, peak_extra_bytes(fn)))
    return results


def bench_rms_norm(rows: int, hidden: int, iters: int, copy_bw: float) -> list:
    x = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = torch.ones(hidden, device="cuda", dtype=torch.bfloat16).requires_grad_()
    dy = torch.randn_like(x)
    # forward reads x, writes y; backward reads dy and x, writes dx (dw is O(hidden)).
    moved = 5 * rows * hidden * x.element_size()

    def kjit_autograd():
        torch.autograd.grad(kt.rms_norm(x, w, 1e-6), (x, w), dy)

    def hf_llama(a, b):
        h = a.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return b * h.to(a.dtype)

    def eager():
        torch.autograd.grad(hf_llama(x, w), (x, w), dy)

    compiled_norm = torch.compile(hf_llama)

    def compiled():
        torch.autograd.grad(compiled_norm(x, w), (x, w), dy)

    op = _kernels.rms_norm_op(x, w, 1e-6, 0.0, "llama", False)
    y, dx, dw = torch.empty_like(x), torch.empty_like(x), torch.empty_like(w)
    rstd = torch.empty(rows, device="cuda")
    workspace = torch.empty(op.backward_workspace_bytes(rows), dtype=torch.uint8, device="cuda")
    stream = torch.cuda.current_stream().cuda_stream
    m = lambda t, n: _kernels.as_matrix(t.detach(), n)

    def kjit_op():
        op.forward(stream, x=m(x, "x"), weight=m(w, "w"), y=m(y, "y"),
                   rstd=_kernels.as_vector(rstd))
        op.backward(stream, dy=m(dy, "dy"), x=m(x, "x"), weight=m(w, "w"),
                    rstd=_kernels.as_vector(rstd), dx=m(dx, "dx"), dw=m(dw, "dw"),
                    workspace=workspace.data_ptr(), workspace_bytes=workspace.numel())

    return [_row(name, timed(fn, iters), moved, copy_bw, peak_extra_bytes(fn))
            for name, fn in (("kjit.torch (autograd)", kjit_autograd),
                             ("kjit.torch (autograd, CUDA graph)", graphed(kjit_autograd)),
                             ("kjit op (C API)", kjit_op), ("torch eager (LlamaRMSNorm)", eager),
                             ("torch.compile", compiled))]


def timed_ms(fn, iters: int, budget_ms: float = 1000.0) -> tuple:
    """(ms per call, calls timed) of fn from CUDA events around calls made back to back. At tens
    of milliseconds or more a call the host queues far ahead of the GPU, so this is GPU time;
    `timed`'s sleep kernel would only add seconds at 131072 rows. One call sizes the run to about
    budget_ms: at least 3 calls, at most iters (fn has run before: kernels built, memory cached)."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    calls = max(3, min(iters, int(budget_ms / start.elapsed_time(end))))
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls, calls


def _release() -> None:
    """Frees what a finished (or failed) implementation left: an out-of-memory error's traceback
    holds its frames' tensors until collected, and the caching allocator keeps the blocks; the
    next implementation must see the whole GPU (at 131072 rows eager's logits alone are 31 GiB)."""
    gc.collect()
    torch.cuda.empty_cache()


_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def out_of_memory_row(name: str, error: Exception) -> dict:
    """The row of an implementation that ran out of memory, with the allocation torch refused
    ("Tried to allocate 62.62 GiB", rounded as torch prints it) when the message says."""
    asked = re.search(r"Tried to allocate ([0-9.]+) (B|KiB|MiB|GiB|TiB)", str(error))
    return {"impl": name, "out_of_memory": True,
            "bytes_asked": int(float(asked[1]) * _UNITS[asked[2]]) if asked else None,
            "error": str(error)}


def lce_row(name: str, fn, iters: int, flops: Optional[float] = None) -> dict:
    """fn's row: peak extra memory (two calls, which also warm it up), then its time (and TFLOP/s
    when flops is given); or, when it runs out of memory, the row saying so. Memory is released
    either way."""
    try:
        extra = peak_extra_bytes(fn)
        ms, calls = timed_ms(fn, iters)
    except torch.cuda.OutOfMemoryError as e:
        row = out_of_memory_row(name, e)
    else:
        row = {"impl": name, "ms": round(ms, 3), "peak_extra_bytes": extra, "iters": calls}
        if flops:
            row["tflops"] = round(flops / (ms * 1e-3) / 1e12, 1)
    _release()
    return row


def _eager_loss(hidden, weight, target):
    return F.cross_entropy(hidden @ weight.T, target)


def _eager_fp32_loss(hidden, weight, target):
    return F.cross_entropy((hidden @ weight.T).float(), target)


def _loss_and_grads(loss_fn, hidden, weight, target):
    """A training step's lm_head + loss: the loss, d_hidden and d_weight."""
    loss = loss_fn(hidden, weight, target)
    return (loss.detach(), *torch.autograd.grad(loss, (hidden, weight)))


# kjit's loss against eager's with fp32 logits, which rounds what kjit rounds: the logits to bf16
# (both from a bf16 GEMM), the logits' gradient to bf16 before the gradient GEMMs, each output
# once. What differs is the order of fp32 sums, so the gradients agree to a few of bf16's 2^-8
# roundings: within 2^-6 of the largest gradient (the bound tests/python/test_torch_gpu.py's
# LCE_ATOL uses). The loss, fp32 from the same bf16 logits in both, is held to 1e-2 relative only
# (a loose bound: the check guards the timings, not the op); the errors themselves go in the JSON.
LCE_CHECK_LOSS_RTOL = 1e-2
LCE_CHECK_GRAD_OF_MAX = 2**-6


def check_linear_cross_entropy(hidden, weight, target) -> dict:
    """kjit's loss and gradients against torch eager's (fp32 logits) on the benchmark's inputs;
    {"skipped": why} when either runs out of memory (the reference does at 131072 rows: its fp32
    logits, their log-softmax and its gradient need 63 GiB each)."""
    reference = "torch eager, .float() logits"
    got = None
    try:
        got = _loss_and_grads(kt.linear_cross_entropy, hidden, weight, target)
        expected = _loss_and_grads(_eager_fp32_loss, hidden, weight, target)
    except torch.cuda.OutOfMemoryError:
        who = "kjit" if got is None else reference
        return {"reference": reference, "skipped": f"{who} ran out of memory"}
    loss_rel = abs(got[0].item() - expected[0].item()) / abs(expected[0].item())
    check = {"reference": reference, "loss": got[0].item(), "loss_expected": expected[0].item(),
             "loss_rel_err": loss_rel, "loss_rtol": LCE_CHECK_LOSS_RTOL,
             "grad_tol_of_max": LCE_CHECK_GRAD_OF_MAX}
    grads_ok = _grads_within(check, ("d_hidden", "d_weight"), got[1:], expected[1:])
    check["ok"] = loss_rel <= LCE_CHECK_LOSS_RTOL and grads_ok
    return check


def _grads_within(check: dict, names, got, expected) -> bool:
    """Whether each gradient's largest error is within LCE_CHECK_GRAD_OF_MAX of its expected
    largest magnitude; both figures go into `check` under the gradient's name."""
    ok = True
    for name, g, e in zip(names, got, expected):
        err = (g.float() - e.float()).abs().max().item()
        largest = e.abs().max().float().item()
        check.update({f"{name}_max_abs_err": err, f"{name}_max_abs": largest})
        ok = ok and err <= LCE_CHECK_GRAD_OF_MAX * largest
    return ok


def _lce_inputs(rows: int, hidden: int, vocab: int) -> tuple:
    """hidden, weight, targets and the GEMMs' flops of bench_linear_cross_entropy's inputs."""
    torch.manual_seed(0)
    h = torch.randn(rows, hidden, device="cuda", dtype=torch.bfloat16).requires_grad_()
    w = (torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    t = torch.randint(0, vocab, (rows,), device="cuda")
    t[::64] = -100
    return h, w, t, 6.0 * rows * hidden * vocab


def _three_gemms(h, w) -> None:
    """What every lm_head + loss implementation computes at least: the logits GEMM and the two
    gradient GEMMs (the forward's output stands for dlogits: values of the right scale)."""
    hd, wd = h.detach(), w.detach()
    logits = torch.mm(hd, wd.T)
    torch.mm(logits, wd, out=torch.empty_like(hd))
    torch.mm(logits.T, hd, out=torch.empty_like(wd))


def _ratios_to_first(results: list) -> None:
    """Each timed row's ratio_to_gemms: its time over the first row's, the GEMMs' (None if even
    they ran out of memory)."""
    floor = results[0].get("ms")
    for r in results:
        if "ms" in r:
            r["ratio_to_gemms"] = round(r["ms"] / floor, 3) if floor else None


def bench_linear_cross_entropy(rows: int, hidden: int, vocab: int, iters: int) -> dict:
    """lm_head + loss, forward + backward, bf16: kjit.torch.linear_cross_entropy against the eager
    step a training loop runs (F.cross_entropy(h @ w.T, t), bf16 logits, and the common .float()
    variant), torch.compile of the bf16 one, and the three GEMMs alone (h @ w.T, dlogits @ w,
    dlogits.T @ h) as the floor every implementation pays. One implementation at a time holds
    memory: at 131072 x 128256 eager's logits are 31 GiB in bf16 (the .float() copy 63 GiB, its
    gradient as much again), so it may run out where kjit (inputs, gradients, a fp32 d_weight
    accumulator: about 6 GiB at LLaMA 3's lm_head) does not. TFLOP/s counts the GEMMs' 6 * rows *
    hidden * vocab flops for every row.

    Inputs as in training: hidden ~ N(0, 1) (the final norm's output), weight ~ N(0, 0.02^2) (the
    usual init), so the logits spread with std 0.02 * sqrt(hidden) (1.3 at 4096) and the softmax
    is neither one-hot nor flat; targets uniform over the vocabulary with every 64th ignored."""
    h, w, t, flops = _lce_inputs(rows, hidden, vocab)
    check = check_linear_cross_entropy(h, w, t)
    _release()

    results = [lce_row("three GEMMs alone (torch.mm)", lambda: _three_gemms(h, w), iters, flops)]
    for name, loss_fn in (("kjit.torch.linear_cross_entropy", kt.linear_cross_entropy),
                          ("torch eager (bf16 logits)", _eager_loss),
                          ("torch eager (.float() logits)", _eager_fp32_loss),
                          ("torch.compile (bf16 logits)", torch.compile(_eager_loss))):
        results.append(lce_row(name, lambda f=loss_fn: _loss_and_grads(f, h, w, t), iters, flops))
    _ratios_to_first(results)
    return {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": "bf16", "flops": flops,
            "check": check, "results": results}


RL_TEMPERATURE = 0.7


def _eager_rl(logits, target, temperature=RL_TEMPERATURE):
    """TRL's and verl's torch path: log-probabilities and entropy of softmax(logits / T) in fp32."""
    logp = torch.log_softmax(logits.float() / temperature, -1)
    lp = logp.gather(-1, target.clamp(min=0)[:, None])[:, 0]
    return lp, -(logp.exp() * logp).sum(-1)


def _rl_step(fn, inputs, target):
    """A policy step's head: log-probs and entropy, backward from both (as GRPO with an entropy
    bonus), the gradients of the inputs returned."""
    lp, ent = fn(*inputs)
    valid = (target >= 0).float()
    loss = -(lp * valid).sum() - 0.01 * (ent * valid).sum()
    return torch.autograd.grad(loss, inputs)


def _rl_check(got, expected) -> dict:
    """kjit's gradients against eager's (fp32 softmax of the same bf16 logits), as the lce check."""
    check = {"reference": "torch eager, fp32 softmax", "grad_tol_of_max": LCE_CHECK_GRAD_OF_MAX}
    check["ok"] = _grads_within(check, [f"grad{i}" for i in range(len(got))], got, expected)
    return check


def bench_rl(rows: int, hidden: int, vocab: int, iters: int) -> dict:
    """linear_log_probs forward + backward (both upstream gradients) and forward only, bf16, against
    eager, torch.compile, TRL's fused LM head and the GEMMs (issue 47's 1.1x / 1.05x budgets)."""
    h, w, t, flops = _lce_inputs(rows, hidden, vocab)
    kjit_fn = lambda h, w: kt.linear_log_probs(h, w, t, temperature=RL_TEMPERATURE,  # noqa: E731
                                               entropy=True)
    eager_fn = lambda h, w: _eager_rl(h @ w.T, t)  # noqa: E731
    try:
        check = _rl_check(_rl_step(kjit_fn, (h, w), t), _rl_step(eager_fn, (h, w), t))
    except torch.cuda.OutOfMemoryError:
        check = {"skipped": "out of memory"}
    _release()
    impls = [("kjit.torch.linear_log_probs", kjit_fn), ("torch eager (fp32 softmax)", eager_fn),
             ("torch.compile (same)", torch.compile(eager_fn))]
    if importlib.util.find_spec("trl") is not None:
        try:
            from trl.kernels import ChunkedLogProbFunction

            def trl_fn(h, w):
                out = ChunkedLogProbFunction.apply(h, w, None, t.clamp(min=0), RL_TEMPERATURE,
                                                   4096, None, 1.0, ("log_probs", "entropy"))
                return out[0], out[1]
            impls.append(("TRL ChunkedLogProbFunction", trl_fn))
        except ImportError:
            pass

    results = [lce_row("three GEMMs alone (torch.mm)", lambda: _three_gemms(h, w), iters, flops)]
    for name, fn in impls:
        results.append(lce_row(name, lambda f=fn: _rl_step(f, (h, w), t), iters, flops))
    _ratios_to_first(results)
    forward = [lce_row("logits GEMM alone (torch.mm)", lambda: torch.mm(h.detach(), w.detach().T),
                       iters, flops / 3)]
    for name, fn in impls:
        def run(f=fn):
            with torch.no_grad():
                f(h, w)
        forward.append(lce_row(name + ", forward only", run, iters, flops / 3))
    _ratios_to_first(forward)
    return {"op": "linear_log_probs", "rows": rows, "hidden": hidden, "vocab": vocab,
            "dtype": "bf16", "temperature": RL_TEMPERATURE, "flops": flops, "check": check,
            "results": results + forward}


def bench_rl_logits(rows: int, vocab: int, iters: int, copy_bw: float) -> dict:
    """log_probs from bf16 logits: forward + backward (gradient over the logits) and forward only,
    against eager and torch.compile. "of copy": the logits read and the gradient written once
    (the loss's bytes; the RL head reads the logits once more, in its backward)."""
    torch.manual_seed(0)
    base = torch.randn(rows, vocab, device="cuda", dtype=torch.bfloat16) * 2
    t = torch.randint(0, vocab, (rows,), device="cuda")
    work = base.clone()

    def kjit_step():
        # An intermediate, as lm_head's output is, so that the gradient goes over it: `work`
        # holds gradients after the first call (the kernels' time does not depend on the values).
        x = work.detach().requires_grad_()
        inter = x.view_as(x)
        lp, ent = kt.log_probs(inter, t, RL_TEMPERATURE, entropy=True, inplace_backward=True)
        torch.autograd.backward([lp, ent], [torch.ones_like(lp), torch.full_like(ent, 0.01)])

    def eager_step(compiled=None):
        x = base.detach().requires_grad_()
        lp, ent = (compiled or _eager_rl)(x, t)
        torch.autograd.backward([lp, ent], [torch.ones_like(lp), torch.full_like(ent, 0.01)])

    compiled = torch.compile(_eager_rl)
    moved = 2.0 * rows * vocab * 2
    results = []
    for name, fn in (("kjit.torch.log_probs (in place)", kjit_step),
                     ("torch eager (fp32 softmax)", eager_step),
                     ("torch.compile (same)", lambda: eager_step(compiled)),
                     ("kjit.torch.log_probs, forward only",
                      lambda: kt.log_probs(base, t, RL_TEMPERATURE, entropy=True)),
                     ("torch eager, forward only", lambda: _eager_rl(base, t))):
        row = lce_row(name, fn, iters)
        if "ms" in row:
            row["of_copy"] = round(moved / (row["ms"] * 1e-3) / copy_bw, 3)
        results.append(row)
    return {"op": "log_probs", "rows": rows, "vocab": vocab, "dtype": "bf16",
            "temperature": RL_TEMPERATURE, "check": {"ok": True}, "results": results}


def _ratios(results: list, key: str) -> None:
    """Each row's time over the first's (the plain op's)."""
    floor = results[0].get(key)
    for r in results:
        if key in r and floor:
            r["ratio_to_plain"] = round(r[key] / floor, 4)


TRAINER_EXTRAS = ("lse", "token_accuracy", "mean_entropy")


def bench_extras(rows: int, vocab: int, iters: int, copy_bw: float) -> dict:
    """What the extras cost the fused cross-entropy (issue 35 asks at most 2%): forward +
    backward with the gradient in place, plain and with lse, token accuracy and mean entropy,
    through autograd and as the bare op; each checked against float64 first."""
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device="cuda")
    target[::16] = -100
    moved = 2 * rows * vocab * logits.element_size()
    check = _check_extras(kt.cross_entropy(logits.detach(), target, extras=True), logits, target)

    def autograd(extras):
        def step():
            out = kt.cross_entropy(logits.view_as(logits), target, extras=extras)
            torch.autograd.grad(out.loss if extras else out, logits)
        return step

    def bare(extras):
        op = _kernels.cross_entropy_op(logits, target, LossOptions(), None, bool(extras),
                                       bool(extras))
        out = [torch.empty((), device="cuda")] + [torch.empty(rows, device="cuda")
                                                  for _ in range(2)]
        am = torch.empty(rows, dtype=target.dtype, device="cuda")
        workspace = torch.empty(op.workspace_bytes(rows), dtype=torch.uint8, device="cuda")
        matrix = _kernels.as_matrix(logits.detach(), "logits")
        fields = dict(logits=matrix, targets=_kernels.as_index(target, "target"),
                      loss=_kernels.as_vector(out[0]), grad=matrix,
                      workspace=workspace.data_ptr(), workspace_bytes=workspace.numel())
        if extras:
            fields.update(lse=_kernels.as_vector(out[1]), entropy=_kernels.as_vector(out[2]),
                          argmax=_kernels.as_index(am, "argmax"))
        stream = torch.cuda.current_stream().cuda_stream
        return lambda: op.forward_backward(stream, **fields)

    results = []
    for name, fn in (("kjit op (C API), plain", bare(False)),
                     ("kjit op (C API), lse + argmax + entropy", bare(True)),
                     ("kjit.torch (autograd), plain", autograd(False)),
                     ("kjit.torch (autograd), " + " + ".join(TRAINER_EXTRAS), autograd(
                         TRAINER_EXTRAS))):
        n = iters if rows * vocab < 1 << 30 else max(iters // 4, 5)
        results.append(_row(name, timed(fn, n), moved, copy_bw, peak_extra_bytes(fn)))
    _ratios(results[:2], "gpu_us")
    _ratios(results[2:], "gpu_us")
    return {"rows": rows, "vocab": vocab, "check": check, "results": results}


def _check_extras(out, logits, target) -> dict:
    """out's lse, entropy, token accuracy against float64 from logits (the same values)."""
    with torch.no_grad():
        x = logits.detach().double()
        lse = torch.logsumexp(x, -1)
        logp = x - lse[:, None]
        entropy = -(logp.exp() * logp).sum(-1)
        valid = target != -100
        accuracy = ((x.argmax(-1) == target) & valid).sum().item() / valid.sum().item()
        errs = {"lse_max_abs_err": (out.lse.double() - lse).abs().max().item(),
                "entropy_max_abs_err": (out.entropy.double() - entropy).abs().max().item(),
                "token_accuracy": out.token_accuracy.item(), "token_accuracy_expected": accuracy}
    tol = 1e-4 * (1 + lse.abs().max().item())
    errs["ok"] = (errs["lse_max_abs_err"] <= tol and errs["entropy_max_abs_err"] <= tol
                  and abs(errs["token_accuracy"] - accuracy) <= 2 / valid.sum().item())
    return errs


def bench_lce_extras(rows: int, hidden: int, vocab: int, iters: int) -> dict:
    """linear_cross_entropy forward + backward, plain and with lse, token accuracy and mean
    entropy (inputs as bench_linear_cross_entropy's)."""
    h, w, t, flops = _lce_inputs(rows, hidden, vocab)

    def step(extras):
        def run():
            out = kt.linear_cross_entropy(h, w, t, extras=extras)
            torch.autograd.grad(out.loss if extras else out, (h, w))
        return run

    results = [lce_row("kjit.torch.linear_cross_entropy, plain", step(False), iters, flops),
               lce_row("same, " + " + ".join(TRAINER_EXTRAS), step(TRAINER_EXTRAS), iters,
                       flops)]
    _ratios(results, "ms")
    return {"rows": rows, "hidden": hidden, "vocab": vocab, "dtype": "bf16", "results": results}


# LLaMA 3.1 8B's layer and lm_head shapes; two layers keep the step's time mostly the lm_head's and
# the loss's, which is what kjit changes.
HF_LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                   num_attention_heads=32, num_key_value_heads=8, num_hidden_layers=2,
                   max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5)
HF_CHECK_LOSS_RTOL = 1e-2  # bf16 models whose losses are computed from differently rounded logits


def bench_hf_step(batch: int, seq: int, iters: int) -> dict:
    """One model, three ways, each alone on the GPU while it runs: transformers' own step
    (its loss upcasts the bf16 logits to fp32), kjit.torch.apply_to (kjit's norms and fused
    cross-entropy over the logits, gradient in place) and apply_to(linear_cross_entropy=True)
    (no logits). Every step sets the gradients to None first, as an optimizer's zero_grad does, so
    the peak extra memory is what a step takes beyond the model, its gradients and the inputs. A
    way that runs out of memory is a row saying so."""
    import transformers
    config = transformers.LlamaConfig(**HF_LLAMA_8B)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).train()
    ids = torch.randint(0, config.vocab_size, (batch, seq),
                        generator=torch.Generator().manual_seed(1)).cuda()
    results, losses = [], {}
    for name, patch in (("transformers", None), ("kjit.torch.apply_to", {}),
                        ("apply_to, inplace_backward=True", {"inplace_backward": True}),
                        ("apply_to, metrics=True", {"metrics": True}),
                        ("kjit.torch.apply_to, lm_head fused", {"linear_cross_entropy": True}),
                        ("apply_to, lm_head fused, metrics",
                         {"linear_cross_entropy": True, "metrics": True})):
        model = copy.deepcopy(base)
        if patch is not None:
            kt.apply_to(model, **patch)
        model.cuda()
        last = []

        def step(model=model, last=last):
            model.zero_grad(set_to_none=True)
            out = model(input_ids=ids, labels=ids)
            out.loss.backward()
            last[:] = [out.loss.detach()]

        row = lce_row(name, step, iters)
        if last:
            losses[name] = row["loss"] = last[0].item()
        results.append(row)
        del model, step, last
        _release()
    reference = losses.get("transformers")
    check = {"reference": "transformers", "losses": losses, "loss_rtol": HF_CHECK_LOSS_RTOL,
             "ok": reference is not None and all(
                 abs(v - reference) <= HF_CHECK_LOSS_RTOL * abs(reference)
                 for v in losses.values())}
    if reference is None:
        check["skipped"] = "transformers' own step did not run"
    floor = results[0].get("ms")
    for r in results:
        if "ms" in r:
            r["ratio_to_transformers"] = round(r["ms"] / floor, 3) if floor else None
    return {"batch": batch, "seq": seq, "model": "llama-3.1-8b, 2 layers", "dtype": "bf16",
            "check": check, "results": results}


def _print_hf(case: str, entry: dict) -> None:
    check = entry["check"]
    losses = ", ".join(f"{k} {v:.5f}" for k, v in check["losses"].items())
    print(f"{case:22} losses: {losses}: {'ok' if check['ok'] else 'FAILED'}")
    for r in entry["results"]:
        if r.get("out_of_memory"):
            print(f"{case:22} {r['impl']:34} out of memory")
            continue
        ratio = r["ratio_to_transformers"]
        print(f"{case:22} {r['impl']:34} {r['ms']:9.2f} {ratio if ratio else '-':>8}  "
              f"+{r['peak_extra_bytes'] / 2**30:7.2f} GiB")


def _print_lce(case: str, entry: dict) -> None:
    check = entry["check"]
    if "skipped" in check:
        print(f"{case:22} check skipped: {check['skipped']}")
    else:
        print(f"{case:22} check against {check['reference']}: loss {check['loss']:.6f} "
              f"(rel err {check['loss_rel_err']:.1e}), max err d_hidden "
              f"{check['d_hidden_max_abs_err']:.2e} of {check['d_hidden_max_abs']:.2e}, d_weight "
              f"{check['d_weight_max_abs_err']:.2e} of {check['d_weight_max_abs']:.2e}: "
              f"{'ok' if check['ok'] else 'FAILED'}")
    for r in entry["results"]:
        if r.get("out_of_memory"):
            asked = r["bytes_asked"]
            print(f"{case:22} {r['impl']:34} out of memory"
                  + (f" (asked {asked / 2**30:.2f} GiB)" if asked else ""))
            continue
        ratio = f"{r['ratio_to_gemms']:6.3f}x" if r["ratio_to_gemms"] else "      -"
        print(f"{case:22} {r['impl']:34} {r['ms']:9.2f} {r['tflops']:8.1f}  {ratio}  "
              f"+{r['peak_extra_bytes'] / 2**30:7.2f} GiB")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kjit.bench", description=__doc__.split(
        "\n\n")[0], epilog=CASES_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help="a case below (repeatable; default "
                        f"{' '.join(DEFAULT_CASES)})")
    parser.add_argument("--iters", type=int, default=50, help="calls timed per implementation "
                        "(lce: at most this many, about a second of them, at least 3)")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    names = args.case or DEFAULT_CASES
    try:
        cases = [parse_case(case) for case in names]
    except ValueError as e:
        parser.error(str(e))
    if any(kind == "hf" for kind, _ in cases) and importlib.util.find_spec("transformers") is None:
        parser.error("the hf: cases need transformers (pip install transformers); leave them out "
                     "with --case")
    if not torch.cuda.is_available():
        print("kjit.bench: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    copy_bw = copy_bandwidth()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "kjit": kjit.full_version(), "copy_bytes_per_s": copy_bw, "cases": []}
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {report['device']}")
    copy_columns = (f"{'case':22} {'impl':34} {'us':>9} {'gpu_us':>9} {'host_us':>8}  "
                    f"{'of copy':>6}  extra")
    headers = {"ce": copy_columns, "norm": copy_columns, "extras": copy_columns,
               "lce-extras": f"{'case':22} {'impl':34} {'ms':>9} {'of plain':>8}  extra",
               "rl": f"{'case':22} {'impl':34} {'ms':>9} {'of GEMMs':>8}  extra",
               "rl-logits": f"{'case':22} {'impl':34} {'ms':>9} {'of copy':>8}  extra",
               "lce": f"{'case':22} {'impl':34} {'ms':>9} {'TFLOP/s':>8}  {'of GEMMs':>7}  extra",
               "hf": f"{'case':22} {'impl':34} {'ms/step':>9} {'of HF':>8}  extra"}
    header = None
    for case, (kind, sizes) in zip(names, cases):
        if header != headers[kind]:  # (printed again where the columns change)
            header = headers[kind]
            print(header)
        if kind == "lce":
            entry = bench_linear_cross_entropy(*sizes, args.iters)
            _print_lce(case, entry)
        elif kind in ("rl", "rl-logits"):
            entry = (bench_rl(*sizes, args.iters) if kind == "rl"
                     else bench_rl_logits(*sizes, args.iters, copy_bw))
            print(f"{case:22} check: {entry['check']}")
            for r in entry["results"]:
                extra = r.get("peak_extra_bytes", 0) / 2**30
                ratio = r.get("ratio_to_gemms", r.get("of_copy", "-"))
                print(f"{case:22} {r['impl']:34} {r.get('ms', float('nan')):9.2f} "
                      f"{ratio!s:>8}  +{extra:7.2f} GiB")
        elif kind == "hf":
            entry = bench_hf_step(*sizes, args.iters)
            _print_hf(case, entry)
        elif kind == "lce-extras":
            entry = bench_lce_extras(*sizes, args.iters)
            for r in entry["results"]:
                extra = r.get("peak_extra_bytes", 0) / 2**30
                print(f"{case:22} {r['impl']:34} {r.get('ms', 0):9.2f} "
                      f"{r.get('ratio_to_plain', '-'):>8}  +{extra:7.2f} GiB")
        elif kind == "extras":
            entry = bench_extras(*sizes, args.iters, copy_bw)
            print(f"{case:22} check: {'ok' if entry['check']['ok'] else 'FAILED'} "
                  f"{entry['check']}")
            for r in entry["results"]:
                print(f"{case:22} {r['impl']:34} {r['us']:9.1f} {r['gpu_us']:9.1f} "
                      f"{r['host_us']:8.1f}  {100 * r['bandwidth_ratio']:5.1f}%  "
                      f"x{r.get('ratio_to_plain', 0):.4f}")
        else:
            run = bench_cross_entropy if kind == "ce" else bench_rms_norm
            entry = {"results": run(*sizes, args.iters, copy_bw)}
            for r in entry["results"]:
                print(f"{case:22} {r['impl']:34} {r['us']:9.1f} {r['gpu_us']:9.1f} "
                      f"{r['host_us']:8.1f}  {100 * r['bandwidth_ratio']:5.1f}%  "
                      f"+{r['peak_extra_bytes'] / 2**20:8.1f} MiB")
        report["cases"].append({"case": case, **entry})
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    failed = [c["case"] for c in report["cases"] if not c.get("check", {}).get("ok", True)]
    if failed:
        print(f"kjit.bench: kjit's loss or gradients are off at {' '.join(failed)} (see the check "
              "lines)", file=sys.stderr)
        return 1
    return 0

