"""kjit.torch.distributed's vocab-parallel cross-entropy over gloo with 2 and 4 processes on the
CPU: the per-shard steps are sharded_reference.py's float64 torch implementation of the statistics
contract kjit's kernels fulfil, so what runs for real is the combining logic (the max and sums
all-reduces through functional collectives, the rescale between them, the local gradient, autograd,
DTensor Shard(-1) and local shards with a group). Each case compares the loss and this rank's
slice of the gradient with torch.nn.functional.cross_entropy on the whole logits (with z-loss and
softcap added by torch ops), for every option and reduction.

Tolerances (fp32 logits; the reference computes in float64 and returns the loss in fp32 and the
gradient in the logits' dtype, as kjit's kernels do): loss rtol 2e-6, gradient rtol 1e-5 with
atol 1e-7. A wrong combine (a missing rescale, a sum instead of a max, the local lse) is off by
O(1); test_a_wrong_combine_is_caught shows that the checks fail then.

What this cannot prove: kjit's kernels (their statistics, layout and numerics); the GPU tests at
the end of this file (gloo with CUDA tensors, NCCL with one rank) and
tests/gpu/sharded_cross_entropy_gpu_test.cc do, where there is a GPU.
"""

import json
import os
import re

import pytest

from conftest import needs_gpu, needs_torch

pytestmark = needs_torch

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    import torch.nn.functional as F
except ImportError:
    pass

VOCAB = 37  # odd: DTensor's Shard(-1) gives uneven slices (19 + 18, or 10 + 10 + 10 + 7)
SHAPE = (2, 5)  # rows as [batch, seq]: the op flattens them and "none" gives this shape back
IGNORE = -100

# name -> options; each runs with every reduction.
OPTIONS = {
    "plain": {},
    "class_weights": {"weight": True},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 3.0},
    "ignore_index_7": {"ignore_index": 7},
    "everything": {"weight": True, "label_smoothing": 0.2, "z_loss": 1e-2, "softcap": 4.0},
}
REDUCTIONS = ("none", "sum", "mean")
LOSS_RTOL, GRAD_RTOL, GRAD_ATOL = 2e-6, 1e-5, 1e-7


def _inputs(ignore_index, device="cpu"):
    """The whole logits, targets (two rows ignored), class weights and upstream gradients: the
    same on every rank (seeded)."""
    g = torch.Generator().manual_seed(37)
    logits = (3 * torch.randn(*SHAPE, VOCAB, generator=g)).float()
    target = torch.randint(0, VOCAB, SHAPE, generator=g)
    target[0, 1] = ignore_index
    target[1, 3] = ignore_index
    weight = (0.5 + torch.rand(VOCAB, generator=g)).float()
    up_rows = torch.rand(SHAPE, generator=g).float() + 0.5
    return (logits.to(device), target.to(device), weight.to(device), up_rows.to(device),
            torch.tensor(0.7))


def expected_loss(logits, target, weight, *, ignore_index=IGNORE, reduction="mean",
                  label_smoothing=0.0, z_loss=0.0, softcap=None):
    """kjit's loss on the whole logits from torch ops (float64)."""
    x = logits.double()
    x = softcap * torch.tanh(x / softcap) if softcap else x
    flat, t = x.reshape(-1, x.shape[-1]), target.reshape(-1)
    w = None if weight is None else weight.double()
    per_row = F.cross_entropy(flat, t, weight=w, ignore_index=ignore_index, reduction="none",
                              label_smoothing=label_smoothing)
    valid = t != ignore_index
    w_t = torch.ones_like(per_row) if w is None else w[torch.where(valid, t, 0)]
    per_row = per_row + torch.where(valid, z_loss * torch.logsumexp(flat, -1) ** 2 * w_t, 0.0)
    if reduction == "none":
        return per_row.reshape(target.shape)
    if reduction == "sum":
        return per_row.sum()
    return per_row.sum() / torch.where(valid, w_t, 0.0).sum()


def _kwargs(options, weight):
    kw = {k: v for k, v in options.items() if k != "weight"}
    kw.setdefault("ignore_index", IGNORE)
    return kw, (weight if options.get("weight") else None)


def _compare(name, loss, grad, logits, target, weight, up, options, reduction, start, end):
    """(name, message) when the loss or the gradient slice is off, else None."""
    kw, w = _kwargs(options, weight)
    full = logits.detach().double().requires_grad_()
    want = expected_loss(full, target, w, reduction=reduction, **kw)
    want.backward(up.double() if reduction == "none" else torch.tensor(0.7, dtype=torch.float64))
    want_grad = full.grad[..., start:end]
    if not torch.allclose(loss.double(), want.detach(), rtol=LOSS_RTOL, atol=0):
        return f"{name}: loss {loss.tolist()} != {want.tolist()}"
    if not torch.allclose(grad.double(), want_grad, rtol=GRAD_RTOL, atol=GRAD_ATOL):
        worst = (grad.double() - want_grad).abs().max().item()
        return f"{name}: gradient off by up to {worst}"
    return None


def _init(rank, world, store_dir, backend="gloo"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=world)


def _use_reference():
    from sharded_reference import ReferenceShardKernels
    from kjit.torch import distributed
    distributed.SHARD_KERNELS["cpu"] = ReferenceShardKernels()
    return distributed


def _run_cases(rank, world, device, distributed, options_by_name=OPTIONS):
    """Every option x reduction through local shards placed with vocab_start (DTensor's uneven
    split), equal local shards (the default placement) and a DTensor: the failures and the
    count of cases checked."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    mesh = init_device_mesh(device, (world,))
    failures, checked = [], 0
    for name, options in options_by_name.items():
        for reduction in REDUCTIONS:
            kw, _ = _kwargs(options, None)
            logits, target, weight, up_rows, up_scalar = _inputs(kw["ignore_index"], device)
            up = up_rows if reduction == "none" else up_scalar.to(device)
            kw, w = _kwargs(options, weight)
            # 1. local shards of an uneven split, placed explicitly (vocab_start, vocab).
            start, end = distributed.shard_of(VOCAB, rank, world)
            local = logits[..., start:end].clone().requires_grad_()
            loss = distributed.vocab_parallel_cross_entropy(
                local, target, w, group=dist.group.WORLD, vocab_start=start, vocab=VOCAB,
                reduction=reduction, **kw)
            loss.backward(up)
            failures.append(_compare(f"{name}/{reduction}/local", loss.detach().cpu(),
                                     local.grad.cpu(), logits.cpu(), target.cpu(),
                                     weight.cpu(), up_rows.cpu(), options, reduction, start, end))
            checked += 1
            # 2. equal local shards (the default placement): the first 36 classes.
            width = 36 // world
            even = logits[..., :36]
            even_target = torch.where(target >= 36, 0, target)
            local = even[..., rank * width:(rank + 1) * width].clone().requires_grad_()
            loss = distributed.vocab_parallel_cross_entropy(
                local, even_target, None if w is None else w[:36], reduction=reduction, **kw)
            loss.backward(up)
            failures.append(_compare(f"{name}/{reduction}/even", loss.detach().cpu(),
                                     local.grad.cpu(), even.cpu(), even_target.cpu(),
                                     weight[:36].cpu(), up_rows.cpu(), options, reduction,
                                     rank * width, (rank + 1) * width))
            checked += 1
            # 3. a DTensor sharded on the vocab; the loss comes back replicated.
            # The gradient is read as it leaves the op (torch.autograd.grad), as the layer
            # before it would receive it: torch 2.11's AccumulateGrad replicates an unevenly
            # sharded leaf's gradient (an all-gather; over gloo on CUDA tensors, a SIGSEGV of
            # the GPU workers), 2.15's does not. A hook on the leaf does not avoid it (the
            # accumulation runs after the hook: d.grad came back Replicate, 37 wide);
            # autograd.grad accumulates nothing, which d.grad staying None shows.
            d = distribute_tensor(logits, mesh, [Shard(-1)]).requires_grad_()
            loss = distributed.vocab_parallel_cross_entropy(d, target, w, reduction=reduction,
                                                            **kw)
            assert isinstance(loss, DTensor) and loss.placements == (Replicate(),)
            (grad,) = torch.autograd.grad(
                loss, d, DTensor.from_local(up, mesh, [Replicate()], run_check=False))
            assert grad.placements == (Shard(d.dim() - 1),) and d.grad is None
            failures.append(_compare(f"{name}/{reduction}/dtensor", loss.to_local(),
                                     grad.to_local(), logits, target, weight, up_rows,
                                     options, reduction, start, end))
            checked += 1
    return [f for f in failures if f], checked


def _worker(rank, world, store_dir, out_dir, run_cases=None, check_errors=None):
    """The cases (run_cases, default _run_cases) and the argument errors (check_errors, default
    _check_errors) on the CPU with the reference kernels: rank<r>.json in out_dir."""
    _init(rank, world, store_dir)
    try:
        distributed = _use_reference()
        failures, checked = (run_cases or _run_cases)(rank, world, "cpu", distributed)
        errors, error_cases = (check_errors or _check_errors)(rank, world, distributed)
        _report(out_dir, rank, {"failures": failures, "checked": checked, "errors": errors,
                                "error_cases": error_cases})
    finally:
        dist.destroy_process_group()


def _expect_value_error(failures: list, name: str, message: str, call) -> bool:
    """Runs call(), which must raise a ValueError matching `message`; what does not goes into
    failures. False when it failed otherwise (a collective that timed out, a gloo size mismatch):
    the group is out of step then, and the caller stops."""
    try:
        failures.append(f"{name}: no error, loss {call()}")
    except ValueError as e:
        if not re.search(message, str(e)):
            failures.append(f"{name}: {message!r} not in {e}")
    except Exception as e:
        failures.append(f"{name}: {type(e).__name__}: {e}")
        return False
    return True


def _report(out_dir, rank, payload: dict) -> None:
    """This rank's results as out_dir/rank<r>.json, then a barrier: no rank tears down while a
    peer still uses the connection."""
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(payload, f)
    dist.barrier()


def _faults_of(out_dir, rank) -> str:
    return f"{out_dir}/faults-rank{rank}.txt"


_fault_file = None  # (kept open for the worker's life)


def _with_faulthandler(rank, worker, world, store_dir, out_dir, *extra):
    """worker(rank, world, store_dir, out_dir, *extra) with faulthandler writing the Python
    stacks of every thread to out_dir/faults-rank<r>.txt should the process die of a signal
    (SIGSEGV, SIGABRT, ...), which mp.spawn reports with no traceback."""
    global _fault_file
    import faulthandler
    _fault_file = open(_faults_of(out_dir, rank), "w")
    faulthandler.enable(file=_fault_file, all_threads=True)
    worker(rank, world, store_dir, out_dir, *extra)


def _spawn(worker, world, tmp_path, *extra):
    store, out = tmp_path / "store", tmp_path / "out"
    store.mkdir()
    out.mkdir()
    try:
        mp.spawn(_with_faulthandler, args=(worker, world, str(store), str(out), *extra),
                 nprocs=world, join=True)
    except mp.ProcessExitedException as e:
        faults = [f"rank {r}:\n{text}" for r in range(world)
                  if (text := _read_or_empty(_faults_of(out, r)))]
        raise AssertionError(f"{e}; where the ranks were when they died (faulthandler):\n" +
                             ("\n".join(faults) or "nothing written")) from e
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    return results


def _read_or_empty(path) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _crashing_worker(rank, world, store_dir, out_dir):
    import faulthandler
    faulthandler._sigsegv()


def test_a_worker_that_dies_of_a_signal_says_where(tmp_path):
    """A rank that dies of SIGSEGV (as the GPU workers once did, with no traceback) fails the
    test with its Python stack."""
    with pytest.raises(AssertionError, match=r"(?s)SIGSEGV.*rank 0:.*in _crashing_worker"):
        _spawn(_crashing_worker, 1, tmp_path)


@pytest.mark.parametrize("world", [2, 4])
def test_matches_cross_entropy_on_the_whole_logits(world, tmp_path):
    """Also: bad arguments raise before any collective, naming what to change (_check_errors)."""
    results = _spawn(_worker, world, tmp_path)
    cases = len(OPTIONS) * len(REDUCTIONS) * 3
    for rank, r in enumerate(results):
        assert r["checked"] == cases, f"rank {rank} checked {r['checked']} of {cases} cases"
        assert r["failures"] == [], f"rank {rank}: " + "; ".join(r["failures"])
        assert r["error_cases"] == 8 and r["errors"] == [], f"rank {rank}: {r['errors']}"


def _wrong_combine_worker(rank, world, store_dir, out_dir):
    """The reference with the rescale between the all-reduces left out: must fail the checks."""
    _init(rank, world, store_dir)
    try:
        distributed = _use_reference()
        reference = distributed.SHARD_KERNELS["cpu"]

        class NoRescale(type(reference)):
            def rescale(self, ws, row_max, logits, target, weight, spec):
                rows = logits.shape[0]
                out = ws.clone()
                out[rows:2 * rows] = row_max
                return out

        distributed.SHARD_KERNELS["cpu"] = NoRescale()
        failures, checked = _run_cases(rank, world, "cpu", distributed,
                                       {"plain": {}, "everything": OPTIONS["everything"]})
        _report(out_dir, rank, {"failures": failures, "checked": checked})
    finally:
        dist.destroy_process_group()


def test_a_wrong_combine_is_caught(tmp_path):
    results = _spawn(_wrong_combine_worker, 2, tmp_path)
    for r in results:
        # Every case has a row whose max lies in the other shard, so every case fails.
        assert len(r["failures"]) == r["checked"] > 0, r["failures"]


# Ranks that pass what cannot combine (issue 45, defect 6): name -> (rank, world -> the call's
# arguments: this rank's columns of the whole logits, its keywords), and what every rank's
# ValueError says. Before the check, the first four gave a wrong loss (ranks even disagreeing on it)
# and the row counts that differ hung the all-reduces.
MISMATCHES = {
    "overlapping slices": (
        lambda rank, world: ((0, 20) if rank == 0 else (17, 37), {"vocab_start": (0, 17)[rank],
                                                                   "vocab": VOCAB}),
        r"slices must tile \[0, 37\) once, but rank 1's slice \[17, 37\) overlaps classes "
        r"before 20 \(slices rank 0: \[0, 20\), rank 1: \[17, 37\)"),
    "a gap": (
        lambda rank, world: ((0, 18) if rank == 0 else (19, 37), {"vocab_start": (0, 19)[rank],
                                                                   "vocab": VOCAB}),
        r"but classes \[18, 19\) are on no rank"),
    "options that differ": (
        lambda rank, world: ((0, 18) if rank == 0 else (18, 36),
                             {"label_smoothing": (0.0, 0.1)[rank]}),
        r"ranks disagree on label_smoothing \(rank 0: 0.0, rank 1: 0.1\)"),
    "unequal widths, default vocab_start": (
        lambda rank, world: ((0, 19) if rank == 0 else (19, 37), {}),
        r"ranks disagree on vocab \(rank 0: 38, rank 1: 36\).*pass vocab_start and vocab"),
    "row counts that differ": (
        lambda rank, world: ((0, 18) if rank == 0 else (18, 36), {"rows": 10 - 2 * rank}),
        r"ranks disagree on rows \(rank 0: 10, rank 1: 8\)"),
    "class weights on one rank": (
        lambda rank, world: ((0, 19) if rank == 0 else (19, 37),
                             {"vocab_start": (0, 19)[rank], "vocab": VOCAB, "weight": rank == 0}),
        r"ranks disagree on class weights \(rank 0: given, rank 1: none\)"),
}


def _mismatch_worker(rank, world, store_dir, out_dir):
    """Each MISMATCHES call on both ranks: the errors that are not the expected ValueError; then
    a call that agrees still runs (the failed checks left no collective behind)."""
    import datetime
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # Short, so that a hang (row counts that differ, before the check) fails the case instead.
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=20))
    try:
        distributed = _use_reference()
        logits, target, weight, _, _ = _inputs(IGNORE)
        flat_logits, flat_target = logits.reshape(-1, VOCAB), target.reshape(-1)
        failures = []
        for name, (arguments, message) in MISMATCHES.items():
            (start, end), kw = arguments(rank, world)
            rows = kw.pop("rows", flat_target.shape[0])
            w = weight if kw.pop("weight", False) else None
            def call():
                return distributed.vocab_parallel_cross_entropy(
                    flat_logits[:rows, start:end], flat_target[:rows], w, **kw).item()
            if not _expect_value_error(failures, name, message, call):
                break
        else:
            start, end = distributed.shard_of(VOCAB, rank, world)
            loss = distributed.vocab_parallel_cross_entropy(
                flat_logits[:, start:end], flat_target, vocab_start=start, vocab=VOCAB)
            want = expected_loss(logits, target, None)
            if not torch.allclose(loss.double(), want, rtol=LOSS_RTOL, atol=0):
                failures.append(f"after the errors: loss {loss.item()} != {want.item()}")
        _report(out_dir, rank, {"failures": failures})
    finally:
        dist.destroy_process_group()


def test_ranks_that_cannot_combine_raise_the_same_error_on_every_rank(tmp_path):
    results = _spawn(_mismatch_worker, 2, tmp_path)
    for rank, r in enumerate(results):
        assert r["failures"] == [], f"rank {rank}: " + "; ".join(r["failures"])


def _compile_worker(rank, world, store_dir, out_dir):
    """torch.compile(fullgraph=True) traces the op, its all-reduces included (aot_eager: no C++
    compiler needed), and gives eager's loss and gradient."""
    _init(rank, world, store_dir)
    try:
        distributed = _use_reference()
        logits, target, weight, _, _ = _inputs(IGNORE)
        start, end = distributed.shard_of(VOCAB, rank, world)

        def step(local):
            return distributed.vocab_parallel_cross_entropy(
                local, target, weight, group=dist.group.WORLD, vocab_start=start, vocab=VOCAB,
                label_smoothing=0.1, z_loss=1e-3)

        eager = logits[..., start:end].clone().requires_grad_()
        compiled = eager.detach().clone().requires_grad_()
        want = step(eager)
        want.backward()
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(compiled)
        got.backward()
        failures = []
        if not torch.allclose(got, want, rtol=1e-6, atol=0):
            failures.append(f"loss {got.item()} != eager {want.item()}")
        if not torch.allclose(compiled.grad, eager.grad, rtol=1e-6, atol=1e-8):
            failures.append("gradient differs from eager's")
        _report(out_dir, rank, {"failures": failures, "checked": 1})
    finally:
        dist.destroy_process_group()


def test_torch_compile_fullgraph_traces_the_collectives(tmp_path):
    for rank, r in enumerate(_spawn(_compile_worker, 2, tmp_path)):
        assert r["checked"] == 1 and r["failures"] == [], f"rank {rank}: {r['failures']}"


def _check_errors(rank, world, distributed):
    """Bad arguments raise before any collective, naming what to change: the mismatches and the
    number of cases."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    logits, target, _, _, _ = _inputs(IGNORE)
    mesh = init_device_mesh("cpu", (world,))
    cases = [
        (lambda: distributed.vocab_parallel_cross_entropy(
            distribute_tensor(logits, mesh, [Replicate()]), target), ValueError,
         "sharded on the vocab dimension on a 1-D mesh"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            distribute_tensor(logits, mesh, [Replicate()]), target, group=dist.group.WORLD),
         ValueError, "pass group, vocab_start and vocab only with local shards"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            logits[..., :20], target, vocab_start=20, vocab=VOCAB), ValueError,
         r"slice \[20, 40\)"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            logits[..., :18], target[0]), ValueError, "target must have the logits' shape"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            logits[..., :18], target, reduction="avg"), ValueError, "reduction must be"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            logits[..., :18].double(), target), TypeError, "float32, float16 or bfloat16"),
        (lambda: distributed.vocab_parallel_cross_entropy(
            logits[..., :18], target.float()), TypeError, "class indices"),
    ]
    failures = []
    for call, error, message in cases:
        try:
            call()
            failures.append(f"no error for {message!r}")
        except error as e:
            if not re.search(message, str(e)):
                failures.append(f"{message!r} not in {e}")
    reference = distributed.SHARD_KERNELS.pop("cpu")
    try:
        distributed.vocab_parallel_cross_entropy(logits[..., :18], target)
        failures.append("CPU logits without kernels for the CPU ran")
    except ValueError as e:
        if "must be CUDA tensors" not in str(e):
            failures.append(str(e))
    finally:
        distributed.SHARD_KERNELS["cpu"] = reference
    return failures, len(cases) + 1


# ---- On a GPU: kjit's kernels themselves ----------------------------------------------------

def _gpu_worker(rank, world, store_dir, out_dir, backend):
    """kjit's kernels (SHARD_KERNELS["cuda"]) on CUDA tensors of GPU 0, every option and
    reduction, against torch on the whole logits; fp32 logits, so the tolerances are the
    kernels' (loss rtol 1e-5, gradient rtol 1e-4 atol 1e-6)."""
    global LOSS_RTOL, GRAD_RTOL, GRAD_ATOL
    LOSS_RTOL, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-4, 1e-6
    torch.cuda.set_device(0)
    _init(rank, world, store_dir, backend)
    try:
        from kjit.torch import distributed
        failures, checked = _run_cases(rank, world, "cuda", distributed)
        _report(out_dir, rank, {"failures": failures, "checked": checked})
    finally:
        dist.destroy_process_group()


@needs_gpu
@pytest.mark.parametrize("world, backend", [(2, "gloo"), (4, "gloo"), (1, "nccl")])
def test_kjit_kernels_on_the_gpu(world, backend, tmp_path):
    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    results = _spawn(_gpu_worker, world, tmp_path, backend)
    cases = len(OPTIONS) * len(REDUCTIONS) * 3
    for rank, r in enumerate(results):
        assert r["checked"] == cases and r["failures"] == [], f"rank {rank}: {r['failures']}"

