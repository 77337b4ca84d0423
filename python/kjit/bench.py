"""`python -m kjit.bench`: kjit through autograd beside the op itself (the C API, no autograd),
PyTorch eager and torch.compile, on the same inputs in one process, with the device-to-device copy
bandwidth measured in the same run. Prints a table and writes JSON (--json PATH).

    python -m kjit.bench --json bench.json
    python -m kjit.bench --case ce:16384x128256 --case norm:16384x4096

Times are CUDA-event means over --iters back-to-back iterations after a warm-up, so host overhead
that the GPU cannot hide (small shapes) counts; the "CUDA graph" row replays the same autograd
step captured in a graph, which shows its GPU time alone. Peak extra memory is torch's peak allocation beyond
the inputs during one iteration.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
import torch.nn.functional as F

import kjit
import kjit.torch as kt
from kjit.torch import _kernels

DEFAULT_CASES = ["ce:16384x128256", "ce:4096x128256", "ce:256x128256", "norm:16384x4096",
                 "norm:256x4096"]


def timed(fn, iters: int, warmup: int = 3) -> float:
    """Mean microseconds per call of fn, over iters calls after warmup."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


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
    us = timed(lambda: dst.copy_(src), 20)
    return 2 * src.numel() / (us * 1e-6)


def _row(name, us, moved_bytes, copy_bw, extra=None, **more):
    row = {"impl": name, "us": round(us, 2), "bandwidth_ratio": round(moved_bytes / (us * 1e-6)
                                                                        / copy_bw, 4)}
    if extra is not None:
        row["peak_extra_bytes"] = extra
    row.update(more)
    return row


def bench_cross_entropy(rows: int, vocab: int, iters: int, copy_bw: float) -> list:
    logits = (torch.randn(rows, vocab, device="cuda") * 4).to(torch.bfloat16).requires_grad_()
    target = torch.randint(0, vocab, (rows,), device="cuda")
    moved = 2 * rows * vocab * logits.element_size()  # read the logits once, write the gradient

    def kjit_autograd():
        # The op sees an intermediate, as it sees lm_head's output: the gradient goes in place.
        loss = kt.cross_entropy(logits.view_as(logits), target)
        torch.autograd.grad(loss, logits)

    op = _kernels.cross_entropy_op(logits, target, -100, "mean", 0.0, 0.0, 0.0)
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


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kjit.bench", description=__doc__.split(
        "\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", action="append", help="ce:ROWSxVOCAB or norm:ROWSxHIDDEN "
                        f"(repeatable; default {' '.join(DEFAULT_CASES)})")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kjit.bench: no CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 1
    copy_bw = copy_bandwidth()
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "kjit": kjit.full_version(), "copy_bytes_per_s": copy_bw, "cases": []}
    print(f"copy bandwidth {copy_bw / 1e9:.0f} GB/s on {report['device']}")
    for case in args.case or DEFAULT_CASES:
        kind, _, shape = case.partition(":")
        rows, cols = (int(v) for v in shape.split("x"))
        if kind not in ("ce", "norm"):
            parser.error(f"--case {case}: expected ce:ROWSxVOCAB or norm:ROWSxHIDDEN")
        run = bench_cross_entropy if kind == "ce" else bench_rms_norm
        results = run(rows, cols, args.iters, copy_bw)
        report["cases"].append({"case": case, "results": results})
        for r in results:
            print(f"{case:18} {r['impl']:34} {r['us']:10.1f} us  {100 * r['bandwidth_ratio']:5.1f}%"
                  f"  +{r['peak_extra_bytes'] / 2**20:8.1f} MiB")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
