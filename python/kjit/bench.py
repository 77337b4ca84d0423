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
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F

import kjit
import kjit.torch as kt
from kjit.torch import _kernels

DEFAULT_CASES = ["ce:16384x128256", "ce:4096x128256", "ce:256x128256", "norm:16384x4096",
                 "norm:256x4096"]


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
    print(f"{'case':18} {'impl':34} {'us':>9} {'gpu_us':>9} {'host_us':>8}  {'of copy':>6}  extra")
    for case in args.case or DEFAULT_CASES:
        kind, _, shape = case.partition(":")
        rows, cols = (int(v) for v in shape.split("x"))
        if kind not in ("ce", "norm"):
            parser.error(f"--case {case}: expected ce:ROWSxVOCAB or norm:ROWSxHIDDEN")
        run = bench_cross_entropy if kind == "ce" else bench_rms_norm
        results = run(rows, cols, args.iters, copy_bw)
        report["cases"].append({"case": case, "results": results})
        for r in results:
            print(f"{case:18} {r['impl']:34} {r['us']:9.1f} {r['gpu_us']:9.1f} {r['host_us']:8.1f}"
                  f"  {100 * r['bandwidth_ratio']:5.1f}%  +{r['peak_extra_bytes'] / 2**20:8.1f} MiB")
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
