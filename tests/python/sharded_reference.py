"""A float64 torch implementation of the per-shard steps of kjit.torch.distributed's
vocab-parallel cross-entropy, for CPU tensors: the statistics contract kjit's kernels fulfil
(kjit::ShardedCrossEntropy), so that the combining logic (the all-reduces, their order, the
rescale between them, autograd, DTensor handling) runs over gloo without a GPU.

    from kjit.torch import distributed
    distributed.SHARD_KERNELS["cpu"] = ReferenceShardKernels()

Per row, the workspace holds [local max, max, sum_exp, sum_x, target logit] x rows (float64, in
natural-log units where kjit's kernels use log2 units: the contract is the same, a max all-reduced
with max, then sums all-reduced with sum after each shard rescales its sum_exp to the global max).
What this cannot prove: anything about kjit's kernels themselves (their numerics, layouts and
launches); tests/gpu/sharded_cross_entropy_gpu_test.cc and the GPU tests in
test_distributed_cpu.py check those.
"""

import torch

_STATS = 5  # local max, max, sum_exp, sum_x, target logit


def _capped(logits, spec):
    x = logits.double()
    return spec.options.softcap * torch.tanh(x / spec.options.softcap) if spec.options.softcap else x


def _weights(weight, spec, rows_like):
    """(w over the shard's columns, w_t per row, sum of w over the vocab)."""
    if weight is None:
        ones = torch.ones(spec.shard_end - spec.shard_start, dtype=torch.float64)
        return ones, torch.ones(rows_like.shape[0], dtype=torch.float64), float(spec.vocab)
    w = weight.double()
    t = rows_like.long().clamp(0, spec.vocab - 1)
    return w[spec.shard_start:spec.shard_end], w[t], w.sum()


class ReferenceShardKernels:
    """stats, max_of, sums_of, rescale and finish as kjit.torch._sharded_kernels'."""

    def stats(self, logits, target, weight, spec, lse=False):
        """As kjit's stats kernel: an ignored row (target ignore_index or outside the vocab) is
        read only when the lse is wanted (lse=True); else its statistics are empty (max -inf,
        sums 0), and finish gives it lse -inf."""
        x = _capped(logits, spec)
        w_local, _, _ = _weights(weight, spec, target)
        t = target.long()
        valid = (t != spec.options.ignore_index) & (t >= 0) & (t < spec.vocab)
        read = x if lse else torch.where(valid[:, None], x, float("-inf"))
        local_max = read.max(dim=1).values
        was_read = local_max > float("-inf")
        sum_exp = torch.where(was_read, torch.exp(read - local_max[:, None]).sum(dim=1), 0.0)
        sum_x = torch.where(was_read, (read * w_local).sum(dim=1), 0.0)
        t = t - spec.shard_start
        inside = valid & (t >= 0) & (t < x.shape[1])  # (the kernel's: 0 unless a valid target)
        target_logit = torch.where(inside, x.gather(1, t.clamp(0, x.shape[1] - 1)[:, None])[:, 0],
                                   0.0)
        return torch.cat([local_max, local_max, sum_exp, sum_x, target_logit])

    def max_of(self, ws, logits, target, weight, spec):
        rows = logits.shape[0]
        return ws[rows:2 * rows]

    def sums_of(self, ws, logits, target, weight, spec):
        rows = logits.shape[0]
        return ws[2 * rows:_STATS * rows]

    def rescale(self, ws, row_max, logits, target, weight, spec):
        rows = logits.shape[0]
        out = ws.clone()
        out[rows:2 * rows] = row_max
        # (a row no shard read stays empty: its max -inf is its own, as the kernel's factor 1)
        out[2 * rows:3 * rows] *= torch.where(ws[:rows] == row_max, 1.0,
                                              torch.exp(ws[:rows] - row_max))
        return out

    def finish(self, logits, target, weight, ws, sums, grad_output, grad, spec):
        rows = logits.shape[0]
        row_max = ws[rows:2 * rows]
        sum_exp, sum_x, target_logit = sums.reshape(3, rows)
        lse = row_max + torch.log(sum_exp)
        eps, z, vocab = spec.options.label_smoothing, spec.options.z_loss, spec.vocab
        t = target.long()
        valid = (t != spec.options.ignore_index) & (t >= 0) & (t < vocab)
        w_local, w_t, sum_w = _weights(weight, spec, target)
        per_row = w_t * ((1 - eps) * (lse - target_logit) + z * lse ** 2) + \
            eps / vocab * (lse * sum_w - sum_x)
        per_row = torch.where(valid, per_row, 0.0)
        divisor = torch.where(valid, w_t, 0.0).sum()
        if spec.options.reduction == "none":
            loss = per_row
        elif spec.options.reduction == "sum":
            loss = per_row.sum().reshape(1)
        else:
            loss = (per_row.sum() / divisor).reshape(1)
        gradient = torch.empty(0, dtype=logits.dtype)
        if grad:
            x = _capped(logits, spec)
            p = torch.exp(x - lse[:, None])
            a = (1 - eps) * w_t + eps / vocab * sum_w
            g = p * (a + 2 * z * w_t * lse)[:, None] - eps * w_local / vocab
            local_t = t - spec.shard_start
            inside = (local_t >= 0) & (local_t < x.shape[1])
            onehot = torch.zeros_like(g)
            onehot[inside, local_t[inside]] = 1.0
            g = g - (1 - eps) * w_t[:, None] * onehot
            if spec.options.softcap:
                g = g * (1 - torch.tanh(logits.double() / spec.options.softcap) ** 2)
            scale = torch.ones(1, dtype=torch.float64) if grad_output is None else \
                grad_output.double()
            if spec.options.reduction == "mean":
                scale = scale / divisor
            g = torch.where(valid[:, None], g * scale.reshape(-1, 1), 0.0)
            gradient = g.to(logits.dtype)
        return loss.float(), lse.float(), gradient
