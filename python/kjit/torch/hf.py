"""apply_to(model): kjit's RMSNorm and cross-entropy in a Hugging Face causal LM, in place.

    model = AutoModelForCausalLM.from_config(config).cuda()
    changed = kjit.torch.apply_to(model)   # {"model_type": "llama", "rms_norm": [...], "loss": ...}
    model(input_ids, labels=labels).loss.backward()

Each RMSNorm module becomes a kjit one holding the same weight Parameter (state dicts and
optimizers are unaffected) and computing what the original rounds where it rounds it; the
model's loss function becomes kjit's fused cross-entropy over the model's logits, without the
fp32 copy of the logits Hugging Face's loss makes. Gemma 2's logit soft-cap stays in the model's
forward. Tensors not on a GPU, and a LLaMA-style norm whose weight dtype differs from its input's
(whose output torch would promote), run the original code.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from kjit.torch.functional import cross_entropy, rms_norm

# model_type -> the RMSNorm flavour its norms compute (casting, weight offset).
_SUPPORTED = {
    "llama": ("llama", 0.0),
    "mistral": ("llama", 0.0),
    "qwen2": ("llama", 0.0),
    "qwen3": ("llama", 0.0),
    "gemma": ("gemma", 1.0),
    "gemma2": ("gemma", 1.0),
}


class KjitHFRMSNorm(nn.Module):
    """Stands in for a Hugging Face RMSNorm module, sharing its weight."""

    def __init__(self, original: nn.Module, eps: float, casting: str, offset: float):
        super().__init__()
        self.weight = original.weight
        self.eps = eps
        self.casting = casting
        self.offset = offset
        # Not a submodule: its weight is ours, and it must not appear twice in parameters().
        object.__setattr__(self, "original", original)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        promotes = self.casting == "llama" and self.weight.dtype != x.dtype
        if not x.is_cuda or promotes:
            if promotes:
                warnings.warn(f"kjit: an RMSNorm with {self.weight.dtype} weight got {x.dtype} "
                              "input; its output dtype would be promoted, so the original module "
                              "runs", stacklevel=2)
            return self.original(x)
        return rms_norm(x, self.weight, self.eps, casting=self.casting, offset=self.offset)

    def extra_repr(self) -> str:
        return (f"kjit, {tuple(self.weight.shape)}, eps={self.eps}, casting={self.casting!r}, "
                f"offset={self.offset}")


def _norm_eps(name: str, module: nn.Module) -> float:
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    weight = getattr(module, "weight", None)
    if not isinstance(eps, float) or not isinstance(weight, nn.Parameter) or weight.dim() != 1:
        raise ValueError(f"kjit.apply_to: {name} ({type(module).__name__}) is not an RMSNorm "
                         "kjit knows (expected a 1-D weight Parameter and a float "
                         "variance_epsilon or eps); pass rms_norm=False to leave the norms alone")
    return eps


def _hf_norms(model: nn.Module) -> list:
    """(name, module) of each Hugging Face RMSNorm not yet replaced."""
    return [(name, module) for name, module in model.named_modules()
            if type(module).__name__.endswith("RMSNorm") and not isinstance(module, KjitHFRMSNorm)]


def _replace_norms(model: nn.Module, casting: str, offset: float) -> list:
    replaced = []
    for name, module in _hf_norms(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, KjitHFRMSNorm(module, _norm_eps(name, module), casting, offset))
        replaced.append(name)
    return replaced


def _causal_lm_loss(original, inplace_backward):
    """Hugging Face's ForCausalLMLoss (shift, flatten, mean or sum / num_items_in_batch) on kjit's
    cross-entropy."""

    def loss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
             shift_labels=None, **kwargs):
        if not logits.is_cuda:
            return original(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                            ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        if shift_labels is None:
            labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:]
        target = shift_labels.reshape(-1).to(logits.device)
        flat = logits.reshape(-1, vocab_size)  # a view of lm_head's output, a copy if it must
        if num_items_in_batch is None:
            return cross_entropy(flat, target, ignore_index=ignore_index,
                                 inplace_backward=inplace_backward)
        # sum / n: the gradient is computed for the upstream 1 / n the division will send back.
        count = num_items_in_batch
        if torch.is_tensor(count):
            count = count.to(logits.device)
        scale = torch.ones((), dtype=torch.float32, device=logits.device) / count
        summed = cross_entropy(flat, target, ignore_index=ignore_index, reduction="sum",
                               grad_scale=scale, inplace_backward=inplace_backward)
        return summed / count

    return loss


def apply_to(model: nn.Module, *, rms_norm: bool = True, cross_entropy: bool = True,
             inplace_backward: bool = True) -> dict:
    """Swaps the RMSNorm modules and the causal-LM loss of a Hugging Face LLaMA, Mistral, Qwen2,
    Qwen3, Gemma or Gemma 2 model for kjit's; returns what it changed. Raises ValueError for a
    model it does not support (nothing is changed then).

    inplace_backward: the loss writes its gradient over the logits (the model's output logits
    then hold the gradient after a training forward); False allocates it instead.
    """
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _SUPPORTED:
        raise ValueError(f"kjit.apply_to: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(_SUPPORTED))}")
    if cross_entropy and not (type(model).__name__.endswith("ForCausalLM")
                              and hasattr(model, "loss_function")):
        raise ValueError(f"kjit.apply_to: {type(model).__name__} is not a causal LM with a "
                         "loss_function; pass cross_entropy=False to patch only the norms")
    casting, offset = _SUPPORTED[model_type]
    if rms_norm:  # checked before anything changes
        for name, module in _hf_norms(model):
            _norm_eps(name, module)
    changed = {"model_type": model_type, "rms_norm": [], "loss": None}
    if rms_norm:
        changed["rms_norm"] = _replace_norms(model, casting, offset)
    if cross_entropy:
        original = model.loss_function
        model.loss_function = _causal_lm_loss(original, inplace_backward)
        changed["loss"] = f"{getattr(original, '__name__', type(original).__name__)} -> kjit"
    return changed
