"""verl's fused lm_head + log-probabilities + entropy, on kjit's RL heads.

    from kjit.torch.integrations.verl import linear_cross_entropy
    logprobs, entropy = linear_cross_entropy(hidden, lm_head.weight, labels, temperature, "none")

The same call and return value as verl.utils.kernel.linear_cross_entropy.linear_cross_entropy
(read in verl's source: hidden [..., hidden_size], weight [vocab, hidden_size], labels [...], a
temperature the logits are divided by, a reduction of the log-probabilities, an optional process
group for a vocab-parallel weight), computed by kjit.torch.linear_log_probs, so that a verl actor
whose model forward calls verl's function (its "triton" fused-kernel backend) can call this one
instead: per token, logprobs = log softmax(hidden @ weight.T / T)[label] and entropy = H(softmax(
hidden @ weight.T / T)), fp32, with gradients for hidden and weight from both.
"""

from __future__ import annotations

import torch

from kjit import _capi
from kjit.torch.rl import linear_log_probs

_REDUCTIONS = ("none", "sum", "mean")


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                         temperature: float = 1.0, reduction: str = "none",
                         dist_process_group=None):
    """(logprobs, entropy) of hidden @ weight.T / temperature at labels, as verl returns them.

    - reduction: "none" gives logprobs in labels' shape; "sum" and "mean" reduce them over every
      token (verl's kernels have no ignored label; a label outside [0, vocab) gives 0 here). The
      entropy is per token, in labels' shape, whatever the reduction.
    - dist_process_group: verl's vocab-parallel weight; kjit's RL heads take the whole weight,
      so a process group is refused (NotImplementedError) rather than computing a shard's
      softmax as if it were the whole vocab's.
    """
    if dist_process_group is not None:
        raise NotImplementedError(
            "kjit.torch.verl.linear_cross_entropy: a vocab-parallel weight (dist_process_group) "
            "is not supported; gather the weight, or use verl's own kernel there")
    if not isinstance(reduction, str):
        raise TypeError(f"kjit: reduction must be a str, one of {_REDUCTIONS}, got "
                        f"{_capi.quoted(reduction)}")
    if reduction.lower() not in _REDUCTIONS:
        raise ValueError(f"kjit: reduction must be one of {_REDUCTIONS}, got "
                         f"{_capi.quoted(reduction)}")
    reduction = reduction.lower()
    logprobs, entropy = linear_log_probs(hidden, weight, labels, temperature=temperature,
                                         entropy=True)
    if reduction == "sum":
        logprobs = logprobs.sum()
    elif reduction == "mean":
        logprobs = logprobs.mean()
    return logprobs, entropy
