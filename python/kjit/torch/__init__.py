"""kjit for PyTorch: fused cross-entropy, lm_head + cross-entropy and RMSNorm as autograd ops on
CUDA tensors, and apply_to(model) for Hugging Face causal LMs.

    import kjit.torch
    kjit.torch.apply_to(model)                                    # norms + loss swapped
    loss = kjit.torch.cross_entropy(logits, target, ignore_index=-100)
    loss = kjit.torch.linear_cross_entropy(hidden, lm_head.weight, target)   # no logits in memory
    y = kjit.torch.rms_norm(x, weight, eps=1e-6)
    logprob, entropy = kjit.torch.log_probs(logits, target, temperature=0.7, entropy=True)   # RL
    logprob = kjit.torch.linear_log_probs(hidden, lm_head.weight, target)   # RL, no logits
    from kjit.torch.distributed import vocab_parallel_cross_entropy   # tensor-parallel lm_heads

The ops are torch.library custom ops (torch.ops.kjit.*) with fake implementations, so
torch.compile(fullgraph=True) traces through them and CUDA graphs capture them.
"""

try:
    import torch  # noqa: F401
except ImportError as e:  # pragma: no cover - exercised where torch is absent
    raise ImportError("kjit.torch needs PyTorch (pip install torch); the rest of kjit (kjit.Runtime, "
                      "python -m kjit doctor) works without it") from e

from kjit.torch.functional import LossOutput, cross_entropy, linear_cross_entropy, rms_norm
from kjit.torch.integrations.hf import (KjitFallbackError, KjitFallbackWarning, KjitHFRMSNorm,
                                        apply_to)
from kjit.torch.modules import CrossEntropyLoss, LinearCrossEntropyLoss, RMSNorm
from kjit.torch.rl import linear_log_probs, log_probs

__all__ = ["CrossEntropyLoss", "KjitFallbackError", "KjitFallbackWarning", "KjitHFRMSNorm",
           "LinearCrossEntropyLoss", "LossOutput", "RMSNorm", "apply_to", "cross_entropy",
           "linear_cross_entropy", "linear_log_probs", "log_probs", "rms_norm"]
