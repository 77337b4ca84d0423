"""nn.Module forms of kjit's ops: CrossEntropyLoss, LinearCrossEntropyLoss and RMSNorm.

    loss_fn = kjit.torch.CrossEntropyLoss(ignore_index=-100)
    lce = kjit.torch.LinearCrossEntropyLoss()         # lce(hidden, lm_head.weight, target)
    norm = kjit.torch.RMSNorm(4096, eps=1e-5).cuda().to(torch.bfloat16)
"""

from __future__ import annotations

import warnings
from typing import Optional

import torch
from torch import nn

from kjit.torch.functional import cross_entropy, linear_cross_entropy, rms_norm


class CrossEntropyLoss(nn.Module):
    """torch.nn.CrossEntropyLoss over logits [rows, vocab] (see kjit.torch.cross_entropy). weight,
    the per-class weights, is a buffer as in torch's: .to() and .cuda() move it, state_dict holds
    it."""

    weight: Optional[torch.Tensor]

    def __init__(self, weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                 reduction: str = "mean", label_smoothing: float = 0.0, z_loss: float = 0.0,
                 softcap: Optional[float] = None, inplace_backward: bool = True):
        super().__init__()
        self.register_buffer("weight", weight)
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap
        self.inplace_backward = inplace_backward

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return cross_entropy(logits, target, self.weight, ignore_index=self.ignore_index,
                             reduction=self.reduction, label_smoothing=self.label_smoothing,
                             z_loss=self.z_loss, softcap=self.softcap,
                             inplace_backward=self.inplace_backward)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"softcap={self.softcap}")


class LinearCrossEntropyLoss(nn.Module):
    """lm_head and the loss fused (see kjit.torch.linear_cross_entropy): called with the hidden
    states [rows, hidden_size], lm_head's weight [vocab, hidden_size], the targets [rows] and
    optionally lm_head's bias; it owns no parameters (the lm_head keeps its weight)."""

    def __init__(self, ignore_index: int = -100, reduction: str = "mean",
                 label_smoothing: float = 0.0, z_loss: float = 0.0,
                 softcap: Optional[float] = None, lse_square_scale: Optional[float] = None):
        super().__init__()
        if lse_square_scale is not None:
            warnings.warn("kjit: LinearCrossEntropyLoss's lse_square_scale is now z_loss (as in "
                          "cross_entropy); the old name will go", DeprecationWarning, stacklevel=2)
            z_loss = lse_square_scale
        self.ignore_index = ignore_index
        self.reduction = reduction
        self.label_smoothing = label_smoothing
        self.z_loss = z_loss
        self.softcap = softcap

    def forward(self, hidden: torch.Tensor, weight: torch.Tensor, target: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return linear_cross_entropy(hidden, weight, target, bias, ignore_index=self.ignore_index,
                                    reduction=self.reduction,
                                    label_smoothing=self.label_smoothing, z_loss=self.z_loss,
                                    softcap=self.softcap)

    def extra_repr(self) -> str:
        return (f"ignore_index={self.ignore_index}, reduction={self.reduction!r}, "
                f"label_smoothing={self.label_smoothing}, z_loss={self.z_loss}, "
                f"softcap={self.softcap}")


class RMSNorm(nn.Module):
    """RMSNorm over the last dimension with a learned weight (see kjit.torch.rms_norm). casting
    "llama" with offset 0 is LlamaRMSNorm (weight starts at 1); "gemma" with offset 1 is
    Gemma2RMSNorm (weight starts at 0); "none" computes in x's dtype as plain eager PyTorch
    would (the weight in x's dtype)."""

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, casting: str = "llama",
                 offset: float = 0.0, device=None, dtype=None):
        super().__init__()
        init = torch.zeros if offset else torch.ones
        self.weight = nn.Parameter(init(hidden_size, device=device, dtype=dtype))
        self.eps = eps
        self.casting = casting
        self.offset = offset

    def forward(self, x: torch.Tensor, residual: Optional[torch.Tensor] = None):
        return rms_norm(x, self.weight, self.eps, casting=self.casting, offset=self.offset,
                        residual=residual)

    def extra_repr(self) -> str:
        return (f"{tuple(self.weight.shape)}, eps={self.eps}, casting={self.casting!r}, "
                f"offset={self.offset}")
