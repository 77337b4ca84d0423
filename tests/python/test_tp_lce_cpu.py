"""kjit.torch.distributed.vocab_parallel_linear_cross_entropy (a lm_head split over the vocab, fused
with the loss) over gloo with 2 and 4 processes on the CPU: the per-shard statistics are
sharded_reference.py's float64 torch implementation of the contract kjit's kernels fulfil, so what
runs for real is everything around them (the chunked logits GEMMs, the all-reduces, the reductions
over the rows, the extras riding in the all-reduces, the backward's recomputed logits, d_weight and
d_bias shards, d_hidden's all-reduce, DTensor Shard(0) and local shards with a group, the agreement
checks). Each case compares the loss, d_hidden, this rank's rows of d_weight and d_bias with
F.cross_entropy on the whole logits hidden @ weight.T + bias in float64 (z-loss and softcap added by
torch ops: test_distributed_cpu.expected_loss), for every option and reduction.
The memory per rank the op's docstring states is counted, forward and backward, by a counting
allocator (memory_counter.py, a TorchDispatchMode) with the reference's own temporaries set apart.

Tolerances (fp32 hidden and weight: the op's logits GEMMs round to fp32 where the reference stays
in float64): loss rtol 1e-5, gradients rtol 1e-4 with atol 1e-6. The extras cases use hidden states
and weights that are multiples of 1/4 (every logit exact in fp32, and many ties for the argmax).

What this cannot prove: kjit's kernels; the GPU tests at the end (gloo with CUDA tensors, NCCL with
one rank; against the float64 reference and kjit.torch.linear_cross_entropy on the whole weight) do,
where there is a GPU.
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
    import torch.nn.functional as F

    from test_distributed_cpu import (IGNORE, _expect_value_error, _init, _report, _spawn,
                                      _use_reference, _worker, expected_loss)
except ImportError:
    pass

VOCAB = 37  # odd: Shard(0) gives uneven slices (19 + 18, or 10 + 10 + 10 + 7)
HIDDEN = 8
SHAPE = (2, 5)  # rows as [batch, seq]: the op flattens them and "none" gives this shape back
ROWS = SHAPE[0] * SHAPE[1]

# name -> options; each runs with every reduction.
OPTIONS = {
    "plain": {},
    "bias": {"bias": True},
    "class_weights": {"class_weight": True},
    "label_smoothing": {"label_smoothing": 0.1},
    "z_loss": {"z_loss": 1e-3},
    "softcap": {"softcap": 3.0},
    "ignore_index_7": {"ignore_index": 7},
    "everything": {"bias": True, "class_weight": True, "label_smoothing": 0.2, "z_loss": 1e-2,
                   "softcap": 4.0},
}
REDUCTIONS = ("none", "sum", "mean")
TOL = {"loss_rtol": 1e-5, "grad_rtol": 1e-4, "grad_atol": 1e-6}


def _inputs(ignore_index, device="cpu", exact=False):
    """hidden [2, 5, 8], the whole weight [37, 8] and bias [37], targets (two rows ignored), class
    weights and upstream gradients: the same on every rank (seeded). exact: multiples of 1/4."""
    g = torch.Generator().manual_seed(50)
    if exact:
        hidden = torch.randint(-2, 3, (*SHAPE, HIDDEN), generator=g).float() / 2
        weight = torch.randint(-1, 2, (VOCAB, HIDDEN), generator=g).float() / 2
        bias = torch.randint(-1, 2, (VOCAB,), generator=g).float() / 4
        # Row 0's largest logit on classes 3 and 30, of different ranks: argmax gives 3.
        weight[3] = weight[30] = hidden[0, 0]
        bias[30] = bias[3]
    else:
        hidden = torch.randn(*SHAPE, HIDDEN, generator=g)
        weight = torch.randn(VOCAB, HIDDEN, generator=g)
        bias = torch.randn(VOCAB, generator=g)
    target = torch.randint(0, VOCAB, SHAPE, generator=g)
    target[0, 1] = ignore_index
    target[1, 3] = ignore_index
    class_weight = 0.5 + torch.rand(VOCAB, generator=g)
    up_rows = torch.rand(SHAPE, generator=g) + 0.5
    return {k: v.to(device) for k, v in dict(
        hidden=hidden, weight=weight, bias=bias, target=target, class_weight=class_weight,
        up_rows=up_rows, up_scalar=torch.tensor(0.7)).items()}


def _split(options, data):
    """(the op's keywords, bias or None, class weights or None)."""
    kw = {k: v for k, v in options.items() if k not in ("bias", "class_weight")}
    kw.setdefault("ignore_index", IGNORE)
    return (kw, data["bias"] if options.get("bias") else None,
            data["class_weight"] if options.get("class_weight") else None)


def reference(data, options, reduction):
    """The loss and d_hidden, d_weight, d_bias (None without bias) on the whole weight, float64."""
    kw, bias, class_weight = _split(options, data)
    h = data["hidden"].detach().cpu().double().requires_grad_()
    w = data["weight"].detach().cpu().double().requires_grad_()
    b = None if bias is None else bias.detach().cpu().double().requires_grad_()
    logits = F.linear(h, w, b)
    loss = expected_loss(logits, data["target"].cpu(),
                         None if class_weight is None else class_weight.cpu(),
                         reduction=reduction, **kw)
    up = data["up_rows"] if reduction == "none" else data["up_scalar"]
    loss.backward(up.cpu().double())
    return loss.detach(), h.grad, w.grad, None if b is None else b.grad


def _compare(name, got, want, tol):
    """The first quantity that is off, as a message; None when all match."""
    for what, g, w in zip(("loss", "d_hidden", "d_weight", "d_bias"), got, want):
        if (g is None) != (w is None):
            return f"{name}: {what} is {'missing' if g is None else 'unexpected'}"
        if g is None:
            continue
        g, w = g.detach().cpu().double(), w.detach().cpu().double()
        rtol, atol = ((tol["loss_rtol"], tol.get("loss_atol", 0.0)) if what == "loss" else
                      (tol["grad_rtol"], tol["grad_atol"] +
                       tol.get("grad_atol_of_largest", 0.0) * w.abs().max().item()))
        if g.shape != w.shape or not torch.allclose(g, w, rtol=rtol, atol=atol):
            worst = (g - w).abs().max().item() if g.shape == w.shape else f"shape {g.shape}"
            return f"{name}: {what} off by up to {worst}"
    return None


def _rows_of(full, start, end):
    """(loss, d_hidden, d_weight, d_bias) of the whole weight with this rank's rows of the last
    two."""
    loss, d_hidden, d_weight, d_bias = full
    return loss, d_hidden, d_weight[start:end], None if d_bias is None else d_bias[start:end]


def _local_call(distributed, data, options, reduction, start, end, **more):
    """The op on this rank's rows [start, end) of the weight as local shards: (loss, d_hidden,
    d_weight shard, d_bias shard)."""
    kw, bias, class_weight = _split(options, data)
    hidden = data["hidden"].clone().requires_grad_()
    weight = data["weight"][start:end].clone().requires_grad_()
    bias = None if bias is None else bias[start:end].clone().requires_grad_()
    loss = distributed.vocab_parallel_linear_cross_entropy(
        hidden, weight, data["target"], bias, group=dist.group.WORLD, vocab_start=start,
        vocab=VOCAB, class_weight=class_weight, reduction=reduction, **kw, **more)
    loss.backward(data["up_rows"] if reduction == "none" else data["up_scalar"])
    return loss, hidden.grad, weight.grad, None if bias is None else bias.grad


def _dtensor_call(distributed, data, options, reduction, mesh, hidden_dtensor=False, **more):
    """The op on a DTensor weight (and bias) Shard(0): (loss, d_hidden, this rank's d_weight and
    d_bias shards). The gradients come from torch.autograd.grad, as they leave the op: torch
    2.11's AccumulateGrad would gather an unevenly sharded leaf's gradient (over gloo on CUDA
    tensors, a crash; see test_distributed_cpu.py)."""
    from torch.distributed.tensor import (DTensor, Partial, Replicate, Shard,
                                          distribute_tensor)
    kw, bias, class_weight = _split(options, data)
    weight = distribute_tensor(data["weight"], mesh, [Shard(0)]).requires_grad_()
    bias = None if bias is None else distribute_tensor(bias, mesh, [Shard(0)]).requires_grad_()
    hidden = (distribute_tensor(data["hidden"], mesh, [Replicate()]) if hidden_dtensor else
              data["hidden"].clone()).requires_grad_()
    loss = distributed.vocab_parallel_linear_cross_entropy(
        hidden, weight, data["target"], bias, class_weight=class_weight, reduction=reduction,
        **kw, **more)
    assert isinstance(loss, DTensor) and loss.placements == (Replicate(),)
    up = data["up_rows"] if reduction == "none" else data["up_scalar"]
    inputs = [t for t in (hidden, weight, bias) if t is not None]
    d_hidden, d_weight, *d_bias = torch.autograd.grad(
        loss, inputs, DTensor.from_local(up, mesh, [Replicate()], run_check=False))
    for g in (d_weight, *d_bias):
        assert g.placements == (Shard(0),), g.placements
    if hidden_dtensor:
        reduced = more.get("reduce_hidden_grad", True)
        assert d_hidden.placements == ((Replicate(),) if reduced else (Partial(),)), \
            d_hidden.placements
        d_hidden = d_hidden.full_tensor()
    return (loss.to_local(), d_hidden, d_weight.to_local(),
            d_bias[0].to_local() if d_bias else None)


def _run_cases(rank, world, device, distributed, tol=TOL, options_by_name=OPTIONS):
    """Every option x reduction through local shards of an uneven split in chunks of 3 rows, and a
    DTensor weight in one chunk; then the variants once each. (failures, cases checked)."""
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh(device, (world,))
    start, end = distributed.shard_of(VOCAB, rank, world)
    failures, checked = [], 0

    def check(name, got, data, options, reduction):
        nonlocal checked
        failures.append(_compare(name, got, _rows_of(reference(data, options, reduction), start,
                                                     end), tol))
        checked += 1

    for name, options in options_by_name.items():
        data = _inputs(options.get("ignore_index", IGNORE), device)
        for reduction in REDUCTIONS:
            got = _local_call(distributed, data, options, reduction, start, end, chunk_rows=3)
            check(f"{name}/{reduction}/local", got, data, options, reduction)
            got = _dtensor_call(distributed, data, options, reduction, mesh)
            check(f"{name}/{reduction}/dtensor", got, data, options, reduction)
    data = _inputs(IGNORE, device)
    everything = OPTIONS["everything"]
    for reduction in REDUCTIONS:
        got = _local_call(distributed, data, everything, reduction, start, end, chunk_rows=4,
                          weight_grad_accumulation="output_dtype")
        check(f"output_dtype accumulation/{reduction}", got, data, everything, reduction)
        for reduce_hidden_grad in (True, False):
            got = _dtensor_call(distributed, data, everything, reduction, mesh,
                                hidden_dtensor=True, reduce_hidden_grad=reduce_hidden_grad,
                                chunk_rows=3)
            check(f"dtensor hidden, reduced {reduce_hidden_grad}/{reduction}", got, data,
                  everything, reduction)
        # A plain hidden's gradient left partial: the ranks' parts sum to the whole.
        loss, d_hidden, d_weight, d_bias = _local_call(
            distributed, data, everything, reduction, start, end, reduce_hidden_grad=False)
        dist.all_reduce(d_hidden)
        check(f"partial d_hidden/{reduction}", (loss, d_hidden, d_weight, d_bias), data,
              everything, reduction)
    # Equal slices, the default placement: the first 36 classes (36 // world rows a rank).
    width = 36 // world
    even = dict(data, weight=data["weight"][:36], bias=data["bias"][:36],
                class_weight=data["class_weight"][:36],
                target=torch.where(data["target"] >= 36, 0, data["target"]))
    kw, bias, class_weight = _split(everything, even)
    hidden = even["hidden"].clone().requires_grad_()
    weight = even["weight"][rank * width:(rank + 1) * width].clone().requires_grad_()
    b = bias[rank * width:(rank + 1) * width].clone().requires_grad_()
    loss = distributed.vocab_parallel_linear_cross_entropy(hidden, weight, even["target"], b,
                                                           class_weight=class_weight, **kw)
    loss.backward(even["up_scalar"])
    want = _rows_of(reference(even, everything, "mean"), rank * width, (rank + 1) * width)
    failures.append(_compare("even slices", (loss, hidden.grad, weight.grad, b.grad), want, tol))
    checked += 1
    extra_failures, extra_checked = _run_extras(rank, world, device, distributed, mesh, tol)
    return [f for f in failures + extra_failures if f], checked + extra_checked


def reference_extras(data, options):
    """The LossOutput fields on the whole logits, float64 (exact data: the logits are exact)."""
    kw, bias, class_weight = _split(options, data)
    raw = F.linear(data["hidden"].cpu().double(), data["weight"].cpu().double(),
                   None if bias is None else bias.cpu().double()).reshape(-1, VOCAB)
    softcap = kw.get("softcap")
    x = softcap * torch.tanh(raw / softcap) if softcap else raw
    t = data["target"].cpu().reshape(-1)
    valid = (t != kw["ignore_index"]) & (t >= 0) & (t < VOCAB)
    lse = torch.logsumexp(x, -1)
    p = torch.softmax(x, -1)
    entropy = -(p * torch.log_softmax(x, -1)).sum(-1)
    logprob = torch.where(valid, x.gather(1, t.clamp(0, VOCAB - 1)[:, None])[:, 0] - lse, 0.0)
    predicted = raw.argmax(-1)
    count = valid.sum()
    return {"lse": lse, "predicted": predicted, "entropy": entropy, "target_logprob": logprob,
            "token_accuracy": (valid & (predicted == t)).sum() / count,
            "mean_entropy": torch.where(valid, entropy, 0.0).sum() / count, "num_tokens": count}


def _run_extras(rank, world, device, distributed, mesh, tol):
    """extras=True on exact data (argmax ties across and within shards), local shards in chunks
    and a DTensor weight: every field against the float64 whole-logits values."""
    failures, checked = [], 0
    start, end = distributed.shard_of(VOCAB, rank, world)
    for name, options in (("plain", {}), ("everything", OPTIONS["everything"])):
        data = _inputs(IGNORE, device, exact=True)
        want = reference_extras(data, options)
        kw, bias, class_weight = _split(options, data)
        # (ties: rows whose largest logit is on several classes, row 0's on 3 and 30)
        raw = F.linear(data["hidden"].double(), data["weight"].double(),
                       None if bias is None else bias.double()).reshape(-1, VOCAB)
        ties = (raw == raw.max(-1, keepdim=True).values).sum(-1)
        if ties[0] != 2 or (ties > 1).sum() < 3 or want["predicted"][0] != 3:
            failures.append(f"extras {name}: too few ties in the data ({ties.tolist()})")
        for reduction in REDUCTIONS:
            for how in ("local", "dtensor"):
                if how == "local":
                    out = distributed.vocab_parallel_linear_cross_entropy(
                        data["hidden"], data["weight"][start:end], data["target"],
                        None if bias is None else bias[start:end], vocab_start=start,
                        vocab=VOCAB, class_weight=class_weight, reduction=reduction,
                        extras=True, chunk_rows=4, **kw)
                    fields = out._asdict()
                else:
                    from torch.distributed.tensor import Shard, distribute_tensor
                    out = distributed.vocab_parallel_linear_cross_entropy(
                        data["hidden"], distribute_tensor(data["weight"], mesh, [Shard(0)]),
                        data["target"], None if bias is None else
                        distribute_tensor(bias, mesh, [Shard(0)]), class_weight=class_weight,
                        reduction=reduction, extras=True, **kw)
                    fields = {k: None if v is None else v.to_local()
                              for k, v in out._asdict().items()}
                case = f"extras {name}/{reduction}/{how}"
                loss_want = reference(data, options, reduction)[0]
                problem = _compare(case, (fields.pop("loss"),), (loss_want,), tol)
                z = fields.pop("z_loss")
                for field, value in want.items():
                    got = fields[field]
                    if field in ("lse", "predicted", "entropy", "target_logprob"):
                        if tuple(got.shape) != SHAPE:
                            problem = problem or f"{case}: {field} has shape {tuple(got.shape)}"
                        got = got.reshape(-1)
                    if field in ("predicted", "num_tokens"):
                        if not torch.equal(got.cpu().long(), value.long()):
                            problem = problem or f"{case}: {field} {got.tolist()} != " \
                                f"{value.tolist()}"
                    elif not torch.allclose(got.cpu().double(), value.double(), rtol=1e-5,
                                            atol=1e-5):
                        problem = problem or f"{case}: {field} {got.tolist()} != {value.tolist()}"
                if z is None or (reduction == "none") != (z.dim() > 0):
                    problem = problem or f"{case}: z_loss {z}"
                failures.append(problem)
                checked += 1
    return failures, checked


CASES = len(OPTIONS) * len(REDUCTIONS) * 2 + len(REDUCTIONS) * 4 + 1 + 2 * len(REDUCTIONS) * 2


@pytest.mark.parametrize("world", [2, 4])
def test_matches_cross_entropy_of_the_whole_lm_head(world, tmp_path):
    """Also: bad arguments raise before any collective, naming what to change (_check_errors)."""
    results = _spawn(_worker, world, tmp_path, _run_cases, _check_errors)
    for rank, r in enumerate(results):
        assert r["checked"] == CASES, f"rank {rank} checked {r['checked']} of {CASES} cases"
        assert r["failures"] == [], f"rank {rank}: " + "; ".join(r["failures"])
        assert r["error_cases"] == len(ERRORS) + 1 and r["errors"] == [], \
            f"rank {rank}: {r['errors']}"


# Bad arguments, the same on every rank: each raises before any collective.
# name -> (call(distributed, data, mesh), error, message)
def _errors():
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    def op(distributed, hidden, weight, target, *args, **kw):
        return distributed.vocab_parallel_linear_cross_entropy(hidden, weight, target, *args,
                                                               **kw)

    return {
        "weight replicated": (
            lambda d, x, m: op(d, x["hidden"], distribute_tensor(x["weight"], m, [Replicate()]),
                               x["target"]), ValueError, "must be a DTensor sharded on dim 0"),
        "a group with a DTensor": (
            lambda d, x, m: op(d, x["hidden"], distribute_tensor(x["weight"], m, [Shard(0)]),
                               x["target"], group=dist.group.WORLD), ValueError,
            "pass group, vocab_start and vocab only with local shards"),
        "a plain bias with a DTensor weight": (
            lambda d, x, m: op(d, x["hidden"], distribute_tensor(x["weight"], m, [Shard(0)]),
                               x["target"], x["bias"]), ValueError,
            "bias must be a DTensor sharded on dim 0"),
        "a DTensor bias with a plain weight": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"],
                               distribute_tensor(x["bias"], m, [Shard(0)])), ValueError,
            "pass both as DTensors"),
        "hidden sharded": (
            lambda d, x, m: op(d, distribute_tensor(x["hidden"], m, [Shard(0)]),
                               x["weight"][:18], x["target"]), ValueError,
            "hidden must be replicated"),
        "hidden_size": (
            lambda d, x, m: op(d, x["hidden"][..., :6], x["weight"][:18], x["target"]),
            ValueError, r"hidden must be \[\.\.\., hidden_size\] = \[\.\.\., 8\]"),
        "weight 1-D": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][0], x["target"]), ValueError,
            r"weight must be \[vocab, hidden_size\]"),
        "target's shape": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"][0]), ValueError,
            "target must have hidden's shape"),
        "reduction": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"], reduction="avg"),
            ValueError, "reduction must be"),
        "float64": (
            lambda d, x, m: op(d, x["hidden"].double(), x["weight"][:18].double(), x["target"]),
            TypeError, "float32, float16 or bfloat16"),
        "dtypes differ": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18].half(), x["target"]),
            TypeError, "weight must have hidden's dtype"),
        "float targets": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"].float()),
            TypeError, "class indices"),
        "class weights' shape": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"],
                               class_weight=x["class_weight"][:5]), ValueError,
            r"class_weight must be a 1-D tensor of vocab = \d+ class weights"),
        "chunk_rows": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"], chunk_rows=0),
            ValueError, "chunk_rows must be >= 1"),
        "extras": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"], extras="argmax"),
            ValueError, "extras: unknown 'argmax'"),
        "accumulation": (
            lambda d, x, m: op(d, x["hidden"], x["weight"][:18], x["target"],
                               weight_grad_accumulation="bf16"), ValueError,
            "weight_grad_accumulation must be"),
        "no rows": (
            lambda d, x, m: op(d, x["hidden"][:0], x["weight"][:18], x["target"][:0]),
            ValueError, "no rows"),
    }


ERRORS = ("weight replicated", "a group with a DTensor", "a plain bias with a DTensor weight",
          "a DTensor bias with a plain weight", "hidden sharded", "hidden_size", "weight 1-D",
          "target's shape", "reduction", "float64", "dtypes differ", "float targets",
          "class weights' shape", "chunk_rows", "extras", "accumulation", "no rows")


def _check_errors(rank, world, distributed):
    from torch.distributed.device_mesh import init_device_mesh
    mesh = init_device_mesh("cpu", (world,))
    data = _inputs(IGNORE)
    failures = []
    cases = _errors()
    assert tuple(cases) == ERRORS
    for name, (call, error, message) in cases.items():
        try:
            call(distributed, data, mesh)
            failures.append(f"{name}: no error for {message!r}")
        except error as e:
            if not re.search(message, str(e)):
                failures.append(f"{name}: {message!r} not in {e}")
    reference_kernels = distributed.SHARD_KERNELS.pop("cpu")
    try:
        distributed.vocab_parallel_linear_cross_entropy(data["hidden"], data["weight"][:18],
                                                        data["target"])
        failures.append("CPU tensors without kernels for the CPU ran")
    except ValueError as e:
        if "hidden must be CUDA tensors" not in str(e):
            failures.append(str(e))
    finally:
        distributed.SHARD_KERNELS["cpu"] = reference_kernels
    return failures, len(cases) + 1


# Ranks that pass what cannot combine: name -> (rank -> (this rank's rows of the weight, its
# keywords), what every rank's ValueError says).
MISMATCHES = {
    "overlapping slices": (
        lambda rank: ((0, 20) if rank == 0 else (17, 37),
                      {"vocab_start": (0, 17)[rank], "vocab": VOCAB}),
        r"slices must tile \[0, 37\) once, but rank 1's slice \[17, 37\) overlaps classes "
        r"before 20 .*vocab_start \+ its weight's rows\)"),
    "a gap": (
        lambda rank: ((0, 18) if rank == 0 else (19, 37),
                      {"vocab_start": (0, 19)[rank], "vocab": VOCAB}),
        r"but classes \[18, 19\) are on no rank"),
    "options that differ": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"z_loss": (0.0, 1e-3)[rank]}),
        r"vocab_parallel_linear_cross_entropy's ranks disagree on z_loss "
        r"\(rank 0: 0.0, rank 1: 0.001\)"),
    "unequal widths, default vocab_start": (
        lambda rank: ((0, 19) if rank == 0 else (19, 37), {}),
        r"ranks disagree on vocab \(rank 0: 38, rank 1: 36\).*pass vocab_start and vocab"),
    "row counts that differ": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"rows": 10 - 2 * rank}),
        r"ranks disagree on rows \(rank 0: 10, rank 1: 8\)"),
    "hidden sizes that differ": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"size": 8 - 2 * rank}),
        r"ranks disagree on hidden_size \(rank 0: 8, rank 1: 6\)"),
    "chunk_rows that differ": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"chunk_rows": 3 + 2 * rank}),
        r"ranks disagree on chunk_rows \(rank 0: 3, rank 1: 5\)"),
    "bias on one rank": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"bias": rank == 0}),
        r"ranks disagree on bias \(rank 0: given, rank 1: none\)"),
    "class weights on one rank": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"class_weight": rank == 1}),
        r"ranks disagree on class weights \(rank 0: none, rank 1: given\)"),
    "extras that differ": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36),
                      {"extras": ("entropy", "predicted")[rank]}),
        r"ranks disagree on extras \(rank 0: entropy, rank 1: predicted\)"),
    "hidden's gradient on one rank": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36), {"grad": rank == 0}),
        r"ranks disagree on hidden's gradient \(rank 0: all-reduced, rank 1: none\)"),
    "hidden's gradient reduced on one rank": (
        lambda rank: ((0, 18) if rank == 0 else (18, 36),
                      {"grad": True, "reduce_hidden_grad": rank == 1}),
        r"ranks disagree on hidden's gradient \(rank 0: left partial, rank 1: all-reduced\)"),
}


def _mismatch_worker(rank, world, store_dir, out_dir):
    """Each MISMATCHES call on both ranks must raise the expected ValueError on both; then a call
    that agrees still runs (the failed checks left no collective behind)."""
    import datetime
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    # Short, so that a hang (a mismatch the check misses) fails the case instead.
    dist.init_process_group("gloo", init_method=f"file://{store_dir}/store", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=20))
    try:
        distributed = _use_reference()
        data = _inputs(IGNORE)
        hidden, target = data["hidden"].reshape(ROWS, HIDDEN), data["target"].reshape(-1)
        target = torch.where(target >= 36, 0, target)
        failures = []
        for name, (arguments, message) in MISMATCHES.items():
            (start, end), kw = arguments(rank)
            rows, size = kw.pop("rows", ROWS), kw.pop("size", HIDDEN)
            bias = data["bias"][start:end] if kw.pop("bias", False) else None
            if kw.pop("class_weight", False):
                kw["class_weight"] = data["class_weight"][:kw.get("vocab", 36)]
            h = hidden[:rows, :size].clone().requires_grad_(kw.pop("grad", False))
            def call():
                return distributed.vocab_parallel_linear_cross_entropy(
                    h, data["weight"][start:end, :size], target[:rows], bias, **kw)
            if not _expect_value_error(failures, name, message, call):
                break
        else:
            start, end = distributed.shard_of(VOCAB, rank, world)
            got = _local_call(distributed, data, {}, "mean", start, end)
            failures.append(_compare("after the errors", got,
                                     _rows_of(reference(data, {}, "mean"), start, end), TOL))
        _report(out_dir, rank, {"failures": [f for f in failures if f]})
    finally:
        dist.destroy_process_group()


def test_ranks_that_cannot_combine_raise_the_same_error_on_every_rank(tmp_path):
    results = _spawn(_mismatch_worker, 2, tmp_path)
    for rank, r in enumerate(results):
        assert r["failures"] == [], f"rank {rank}: " + "; ".join(r["failures"])


def _no_full_logits_worker(rank, world, store_dir, out_dir):
    """The logits exist as chunk_rows x (this rank's slice) only: every logits GEMM
    (torch.nn.functional.linear, wrapped while the op runs) is counted, forward and backward."""
    _init(rank, world, store_dir)
    try:
        distributed = _use_reference()
        data = _inputs(IGNORE)
        start, end = distributed.shard_of(VOCAB, rank, world)
        import kjit.torch._common as common  # (lm_head's module)
        widest = []
        real_linear = common.F.linear

        def counting_linear(*args):
            out = real_linear(*args)
            widest.append(tuple(out.shape))
            return out

        common.F.linear = counting_linear
        try:
            got = _local_call(distributed, data, OPTIONS["everything"], "mean", start, end,
                              chunk_rows=3)
        finally:
            common.F.linear = real_linear
        failures = [_compare("counted", got, _rows_of(reference(data, OPTIONS["everything"],
                                                               "mean"), start, end), TOL)]
        # 4 chunks in the forward and 4 recomputed in the backward
        if widest != [(min(3, ROWS - i), end - start) for i in range(0, ROWS, 3)] * 2:
            failures.append(f"logits GEMMs {widest}")
        _report(out_dir, rank, {"failures": [f for f in failures if f]})
    finally:
        dist.destroy_process_group()


def test_logits_exist_one_chunk_of_one_slice_at_a_time(tmp_path):
    for rank, r in enumerate(_spawn(_no_full_logits_worker, 2, tmp_path)):
        assert r["failures"] == [], f"rank {rank}: " + "; ".join(r["failures"])


def test_the_memory_counter_counts():
    """memory_counter.MemoryCounter (the memory test's counting allocator) adds a new storage's
    bytes and takes them off when the storage dies, not when a tensor viewing it does; views and
    in-place ops add nothing; transient regions keep their inner peak out of `peak`; the autograd
    engine's gradients count."""
    from memory_counter import MemoryCounter
    before = torch.ones(250)  # made before: not counted
    w = torch.zeros(500, requires_grad=True)
    with MemoryCounter() as counter:
        a = torch.empty(1000)  # 4000 bytes
        view = a[10:]
        a.add_(1)
        torch.add(a, 1, out=a)
        assert (counter.current, counter.peak) == (4000, 4000)
        b = a * 2 + before[0]  # a temporary (a * 2) and b: 4000 more each, one at a time
        assert (counter.current, counter.peak) == (8000, 12000)
        del b
        del a
        assert counter.current == 4000  # the view keeps a's storage
        del view
        assert (counter.current, counter.peak) == (0, 12000)
        assert counter.reset_peak() == 0 and counter.peak == 0
        with counter.transient():
            scratch = torch.empty(2500)  # 10000 bytes, freed inside: not in peak
            kept = torch.empty(25)  # 100 bytes, returned: in peak
            del scratch
        assert (counter.current, counter.peak, counter.transient_peak) == (100, 100, 10100)
        del kept
        counter.reset_peak()
        # w * 3 (2000 bytes, freed by the sum), then the backward's w.grad (2000 bytes, kept)
        (w * 3).sum().backward()
        assert counter.current == 2000 and 2000 <= counter.peak < 2100
    assert w.grad.shape == (500,)


# The memory test's shape: per rank V/R = 2048 classes, 16 chunks of C = 64 rows, H = 128, fp32.
# A chunk's logits (C*(V/R)*4 = 512 KiB), the fp32 d_weight shard ((V/R)*H*4 = 1 MiB) and the
# O(rows) terms (1024 rows) are distinguishable, and all below the unchunked logits (8 MiB).
MEM_VOCAB, MEM_HIDDEN, MEM_ROWS, MEM_CHUNK = 4096, 128, 1024, 64
# What the float64 reference adds to the formula's O(rows) terms: per row, its saved statistics
# are 64 bytes (a workspace of 5 float64 and the all-reduced sums, 3 float64) where kjit's kernels
# keep 32; and 16 KiB for one chunk's workspaces, the all-reduces' copies, the per-row loss and lse
# and the agreement check's tensors.
MEM_SLACK_PER_ROW, MEM_SLACK = 32, 16384
# With the entropy extra, besides: the per-row fields lse and entropy (4 bytes a row each) and the
# chunk's float64 row max, stacked all-reduce and lse.
MEM_ENTROPY_SLACK_PER_ROW, MEM_ENTROPY_SLACK = 8, 8192


def _memory_worker(rank, world, store_dir, out_dir):
    """Peak bytes above the start of each phase, counted by memory_counter.MemoryCounter, of a
    forward and a backward (d_hidden, d_weight; no bias; reduction mean), without extras and with
    the entropy extra, with the float64 reference kernels. The reference's own temporaries inside
    stats, rescale and finish (several C x (V/R) float64 arrays, where kjit's fused kernels keep
    none) run as transient regions: what is measured is what the docstring's formula covers, the
    logits GEMMs, the kernels' outputs (workspaces, per-row losses, the logits' gradient), the
    all-reduces, the extras' torch passes, the d_hidden and d_weight GEMMs and accumulator. The
    peaks with the reference's temporaries are reported too."""
    _init(rank, world, store_dir)
    try:
        from memory_counter import MemoryCounter
        distributed = _use_reference()
        reference_kernels = distributed.SHARD_KERNELS["cpu"]
        counter = MemoryCounter()

        class Transient(type(reference_kernels)):
            pass

        for name in ("stats", "rescale", "finish"):
            def run(self, *args, _real=getattr(reference_kernels, name)):
                with counter.transient():
                    return _real(*args)
            setattr(Transient, name, run)
        distributed.SHARD_KERNELS["cpu"] = Transient()
        start, end = distributed.shard_of(MEM_VOCAB, rank, world)
        g = torch.Generator().manual_seed(51)
        whole_hidden = torch.randn(MEM_ROWS, MEM_HIDDEN, generator=g)
        whole_weight = torch.randn(MEM_VOCAB, MEM_HIDDEN, generator=g) / 8
        target = torch.randint(0, MEM_VOCAB, (MEM_ROWS,), generator=g)
        results = {}
        for case, extras in (("plain", False), ("entropy", ("entropy",))):
            hidden = whole_hidden.clone().requires_grad_()
            weight = whole_weight[start:end].clone().requires_grad_()
            r = results[case] = {}
            with counter:
                counter.reset_peak()
                out = distributed.vocab_parallel_linear_cross_entropy(
                    hidden, weight, target, group=dist.group.WORLD, chunk_rows=MEM_CHUNK,
                    extras=extras)
                loss = out.loss if extras else out
                r["forward"] = counter.peak
                r["forward_with_reference_temporaries"] = max(counter.peak,
                                                             counter.transient_peak)
                r["kept"] = counter.current
                base = counter.reset_peak()
                loss.backward()
                r["backward"] = counter.peak - base
                r["backward_with_reference_temporaries"] = \
                    max(counter.peak, counter.transient_peak) - base
                del out
            r["loss"] = loss.item()
            r["grads"] = [hidden.grad is not None, weight.grad is not None]
            del loss, hidden, weight
        _report(out_dir, rank, results)
    finally:
        dist.destroy_process_group()


def test_memory_per_rank_is_the_docstrings_formula(tmp_path):
    """The docstring's memory per rank, counted by a counting allocator (memory_counter.py) over
    gloo with 2 ranks (_memory_worker says what counts), with R ranks, V vocab, H hidden_size, b
    the dtype's bytes (fp32 here: 4), C chunk_rows: forward C*(V/R)*b + 32 bytes a row (+
    8*C*(V/R) with the entropy extra); backward C*(V/R)*b + max(C*(V/R)*b, 4*(V/R)*H) +
    4*(V/R)*H besides the gradients (d_hidden rows*H*b; in fp32 the accumulator is d_weight).
    Each measured peak lies between the formula and the formula plus the stated O(rows) slack
    (MEM_SLACK_PER_ROW, MEM_SLACK: the reference's statistics are wider than kjit's; the entropy
    case's per-row fields besides), and stays well below the unchunked logits, rows*(V/R)*b:
    chunking counts. (The docstring's earlier backward, 2*C*(V/R)*b + 4*(V/R)*H, left out each
    chunk's fp32 d_weight product, here 1 MiB against a chunk's 512 KiB logits.)"""
    world, b = 2, 4
    width = MEM_VOCAB // world
    chunk_logits = MEM_CHUNK * width * b
    d_weight_fp32 = 4 * width * MEM_HIDDEN
    slack = MEM_SLACK_PER_ROW * MEM_ROWS + MEM_SLACK
    entropy_slack = slack + MEM_ENTROPY_SLACK_PER_ROW * MEM_ROWS + MEM_ENTROPY_SLACK
    forward = chunk_logits + 32 * MEM_ROWS
    entropy_forward = forward + 8 * MEM_CHUNK * width
    backward = chunk_logits + max(chunk_logits, d_weight_fp32) + d_weight_fp32 + \
        MEM_ROWS * MEM_HIDDEN * b
    unchunked = MEM_ROWS * width * b
    results = _spawn(_memory_worker, world, tmp_path)
    print(json.dumps(results, indent=1))
    for case in ("plain", "entropy"):
        assert results[0][case]["loss"] == pytest.approx(results[1][case]["loss"], rel=1e-6)
    for rank, r in enumerate(results):
        for case, want_forward, over in (("plain", forward, slack),
                                         ("entropy", entropy_forward, entropy_slack)):
            got = r[case]
            assert got["grads"] == [True, True], (rank, case)
            assert want_forward <= got["forward"] <= want_forward + over, \
                (rank, case, got, want_forward)
            assert backward <= got["backward"] <= backward + slack, (rank, case, got, backward)
        assert r["plain"]["forward"] < unchunked / 8 and r["plain"]["backward"] < unchunked / 2, \
            (rank, r)


def _compile_worker(rank, world, store_dir, out_dir):
    """torch.compile(fullgraph=True) traces the op (aot_eager: no C++ compiler needed), its
    all-reduces included, the backward's d_hidden one too, with extras; eager's loss, extras and
    gradients."""
    _init(rank, world, store_dir)
    try:
        distributed = _use_reference()
        data = _inputs(IGNORE)
        start, end = distributed.shard_of(VOCAB, rank, world)

        def step(hidden, weight, bias):
            return distributed.vocab_parallel_linear_cross_entropy(
                hidden, weight, data["target"], bias, group=dist.group.WORLD,
                vocab_start=start, vocab=VOCAB, label_smoothing=0.1, z_loss=1e-3,
                class_weight=data["class_weight"], chunk_rows=3,
                extras=("entropy", "predicted", "target_logprob"))

        eager = [data["hidden"].clone(), data["weight"][start:end].clone(),
                 data["bias"][start:end].clone()]
        compiled = [t.clone().requires_grad_() for t in eager]
        eager = [t.requires_grad_() for t in eager]
        want = step(*eager)
        want.loss.backward()
        got = torch.compile(step, fullgraph=True, backend="aot_eager")(*compiled)
        got.loss.backward()
        failures = [f"{field} differs from eager's" for field, a, b in
                    zip(want._fields, want, got) if (a is None) != (b is None) or
                    (a is not None and not torch.allclose(a.double(), b.double(), rtol=1e-6))]
        failures += [f"gradient {i} differs from eager's" for i, (a, b) in
                     enumerate(zip(eager, compiled))
                     if not torch.allclose(a.grad, b.grad, rtol=1e-6, atol=1e-8)]
        _report(out_dir, rank, {"failures": failures})
    finally:
        dist.destroy_process_group()


def test_torch_compile_fullgraph_traces_the_collectives(tmp_path):
    for rank, r in enumerate(_spawn(_compile_worker, 2, tmp_path)):
        assert r["failures"] == [], f"rank {rank}: {r['failures']}"


def test_the_benchmark_skips_with_too_few_gpus():
    """scripts/gpu/tp-linear-cross-entropy.sh and the torchrun script exit 77 (skipped) when
    the node has fewer GPUs than ranks, before starting anything."""
    import subprocess
    import sys
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    too_many = str(torch.cuda.device_count() + 1)
    env = dict(os.environ, PYTHON=sys.executable, WORLD_SIZE=too_many)
    for command in (["bash", "scripts/gpu/tp-linear-cross-entropy.sh", too_many],
                    [sys.executable, "scripts/gpu/tp_linear_cross_entropy_bench.py"]):
        run = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 77 and "SKIPPED" in run.stdout, (command, run.stdout,
                                                                  run.stderr)


# ---- On a GPU: kjit's kernels themselves ----------------------------------------------------

# The single-GPU op's stated tolerances (tests/python/test_torch_gpu.py's check_lce, on inputs
# whose logits are exact in every dtype): loss rtol 1e-5 atol 1e-5; gradients rtol two of the
# dtype's roundings, atol a dtype's fraction of the largest reference gradient.
LCE_TOL = {dtype: {"loss_rtol": 1e-5, "loss_atol": 1e-5, "grad_rtol": 2 * rtol, "grad_atol": 0.0,
                   "grad_atol_of_largest": atol}
           for dtype, rtol, atol in (("float32", 2e-6, 1e-5), ("float16", 2 ** -10, 2 ** -9),
                                     ("bfloat16", 2 ** -7, 2 ** -6))}


def _gpu_worker(rank, world, store_dir, out_dir, backend):
    """kjit's kernels (SHARD_KERNELS["cuda"]) on CUDA tensors of GPU 0: every case above against
    the float64 reference (fp32, random inputs: loss rtol 1e-5, gradients rtol 1e-4 atol 1e-5);
    then, on exact inputs in fp32, fp16 and bf16, every option and reduction against the float64
    reference with the single-GPU op's stated tolerances (LCE_TOL), and against
    kjit.torch.linear_cross_entropy on the whole weight (the single-GPU op) with twice them."""
    torch.cuda.set_device(0)
    _init(rank, world, store_dir, backend)
    try:
        from kjit.torch import distributed
        import kjit.torch
        tol = {"loss_rtol": 1e-5, "grad_rtol": 1e-4, "grad_atol": 1e-5}
        failures, checked = _run_cases(rank, world, "cuda", distributed, tol)
        start, end = distributed.shard_of(VOCAB, rank, world)
        for dtype in (torch.float32, torch.float16, torch.bfloat16):
            tol = LCE_TOL[str(dtype).split(".")[-1]]
            twice = {k: 2 * v for k, v in tol.items()}
            for name, options in OPTIONS.items():
                for reduction in REDUCTIONS:
                    data = _inputs(options.get("ignore_index", IGNORE), "cuda", exact=True)
                    data.update({k: data[k].to(dtype) for k in ("hidden", "weight", "bias")})
                    got = _local_call(distributed, data, options, reduction, start, end,
                                      chunk_rows=3)
                    want = reference(data, options, reduction)
                    failures.append(_compare(f"{dtype}/{name}/{reduction}", got, _rows_of(
                        want, start, end), tol))
                    kw, bias, class_weight = _split(options, data)
                    h = data["hidden"].reshape(ROWS, HIDDEN).clone().requires_grad_()
                    w = data["weight"].clone().requires_grad_()
                    b = None if bias is None else bias.clone().requires_grad_()
                    loss = kjit.torch.linear_cross_entropy(
                        h, w, data["target"].reshape(-1), b, class_weight=class_weight,
                        reduction=reduction, **kw)
                    up = data["up_rows"] if reduction == "none" else data["up_scalar"]
                    loss.backward(up.reshape(loss.shape).cuda())
                    single = (loss.detach().reshape(got[0].shape).double().cpu(),
                              h.grad.reshape(SHAPE + (HIDDEN,)).double().cpu(), w.grad,
                              None if b is None else b.grad)
                    failures.append(_compare(f"single-GPU op {dtype}/{name}/{reduction}", got,
                                             _rows_of(single, start, end), twice))
                    checked += 2
        _report(out_dir, rank, {"failures": [f for f in failures if f], "checked": checked})
    finally:
        dist.destroy_process_group()


@needs_gpu
@pytest.mark.parametrize("world, backend", [(2, "gloo"), (4, "gloo"), (1, "nccl")])
def test_kjit_kernels_on_the_gpu(world, backend, tmp_path):
    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this torch has no NCCL")
    results = _spawn(_gpu_worker, world, tmp_path, backend)
    cases = CASES + 3 * 2 * len(OPTIONS) * len(REDUCTIONS)
    for rank, r in enumerate(results):
        assert r["checked"] == cases and r["failures"] == [], f"rank {rank}: {r['failures']}"
