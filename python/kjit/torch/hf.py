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

With linear_cross_entropy=True a training forward with labels computes no logits at all: the
loss and the gradients of lm_head's input and weight come from kjit's fused lm_head +
cross-entropy (kjit.torch.linear_cross_entropy), whose memory stays flat in the token count.
It runs the model's own forward, not a copy of it, in three places:

    forward            the model's class becomes a subclass (same name, so save_pretrained writes
                       the original architecture) whose forward arms the fusion when the model
                       trains on labels (model.training, labels given, no logits_to_keep) and
                       disarms it afterwards, also when the forward raised; PEFT, which calls
                       model.forward directly, goes through it too
    lm_head pre-hook   while armed, keeps lm_head's input (the final hidden states) and hands
                       lm_head zero positions, so the logits it returns are empty: [batch, 0, vocab]
    loss function      computes the loss from the kept hidden states and lm_head's weight

The state lives in a thread-local, not in the model: copy.deepcopy(model) fuses on its own, and
nn.DataParallel's replicas run one thread each.
"""

from __future__ import annotations

import copy
import functools
import threading
import warnings

import torch
from torch import nn

from kjit.torch.functional import cross_entropy, linear_cross_entropy, rms_norm

# model_type -> the RMSNorm flavour its norms compute (casting, weight offset).
# Each one's RMSNorm is LlamaRMSNorm's code or Gemma's (checked against transformers 5.17's
# source), and its forward hands lm_head's output to the loss unchanged (Gemma 2 soft-caps it,
# which the fused path applies; Granite, which scales it, is left out).
_SUPPORTED = {
    "llama": ("llama", 0.0),
    "mistral": ("llama", 0.0),
    "mixtral": ("llama", 0.0),
    "phi3": ("llama", 0.0),
    "qwen2": ("llama", 0.0),
    "qwen2_moe": ("llama", 0.0),
    "qwen3": ("llama", 0.0),
    "qwen3_moe": ("llama", 0.0),
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


def _shifted_target(labels, shift_labels, ignore_index, device):
    """ForCausalLMLoss's targets, flattened: position t predicts token t + 1, the last none."""
    if shift_labels is None:
        labels = nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    return shift_labels.reshape(-1).to(device)


def _count_and_upstream(num_items_in_batch, device):
    """(n, 1 / n as the fp32 device tensor the kernels read) for a loss summed and divided by n:
    1 / n is the upstream gradient the division sends back to the sum, bit for bit."""
    count = num_items_in_batch.to(device) if torch.is_tensor(num_items_in_batch) else \
        num_items_in_batch
    return count, torch.ones((), dtype=torch.float32, device=device) / count


class _CausalLMLoss:
    """Hugging Face's ForCausalLMLoss (shift, flatten, mean or sum / num_items_in_batch) on kjit's
    fused lm_head + cross-entropy when a fused forward kept lm_head's input, else on kjit's
    cross-entropy over the logits (use_kjit) or the original. An object rather than a closure, so
    that a patched model still pickles (torch.save(model))."""

    def __init__(self, original, use_kjit: bool, inplace_backward: bool):
        self.original, self.use_kjit, self.inplace_backward = original, use_kjit, inplace_backward
        self.__name__ = getattr(original, "__name__", type(original).__name__)

    def __call__(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                 shift_labels=None, **kwargs):
        kept = _take_kept_lm_head_input()
        if kept is not None:
            return _fused_loss(kept, labels, num_items_in_batch, ignore_index, shift_labels)
        if not (self.use_kjit and logits.is_cuda):
            return self.original(logits, labels, vocab_size,
                                 num_items_in_batch=num_items_in_batch,
                                 ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        target = _shifted_target(labels, shift_labels, ignore_index, logits.device)
        flat = logits.reshape(-1, vocab_size)  # a view of lm_head's output, a copy if it must
        if num_items_in_batch is None:
            return cross_entropy(flat, target, ignore_index=ignore_index,
                                 inplace_backward=self.inplace_backward)
        # sum / n: the gradient is computed for the upstream 1 / n the division will send back.
        count, scale = _count_and_upstream(num_items_in_batch, logits.device)
        summed = cross_entropy(flat, target, ignore_index=ignore_index, reduction="sum",
                               grad_scale=scale, inplace_backward=self.inplace_backward)
        return summed / count


# ---- lm_head and the loss fused ---------------------------------------------------------------

# armed: the lm_head whose input to keep (None: none), with softcap; then kept: (hidden, lm_head,
# softcap).
_fusion = threading.local()
_fused_classes: dict = {}


def _fused_class(cls: type) -> type:
    """cls with a forward that arms the fusion around cls.forward; one per class."""
    fused = _fused_classes.get(cls)
    if fused is not None:
        return fused

    # With cls.forward's signature, which Trainer (the dataset columns it keeps) and generation
    # (the arguments the model takes) read.
    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        keep = kwargs.get("logits_to_keep", 0)
        if not (self.training and kwargs.get("labels") is not None and isinstance(keep, int)
                and keep == 0):
            return cls.forward(self, *args, **kwargs)
        # Armed for this model's own lm_head only, so that another model's forward inside this one
        # (a teacher's, from a hook) computes its logits; the outer state comes back afterwards.
        outer = (getattr(_fusion, "armed", None), getattr(_fusion, "softcap", 0.0),
                 getattr(_fusion, "kept", None))
        _fusion.armed, _fusion.kept = self.get_output_embeddings(), None
        # Only Gemma 2's forward soft-caps the logits (a config may carry the key regardless).
        softcap = getattr(self.config, "final_logit_softcapping", None)
        _fusion.softcap = (softcap or 0.0) if self.config.model_type == "gemma2" else 0.0
        try:
            return cls.forward(self, *args, **kwargs)
        finally:
            _fusion.armed, _fusion.softcap, _fusion.kept = outer

    def __deepcopy__(self, memo):
        # A copy fuses too (what copy.deepcopy would do without __reduce_ex__ below).
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    def __reduce_ex__(self, protocol):
        # Pickled (torch.save(model)) as the model's own class, which pickle can find by name:
        # loaded, it is the unfused model (apply_to it again).
        _, _, *state = super(fused, self).__reduce_ex__(protocol)
        return (object.__new__, (cls,), *state)

    fused = type(cls.__name__, (cls,), {"forward": forward, "__deepcopy__": __deepcopy__,
                                        "__reduce_ex__": __reduce_ex__,
                                        "_kjit_fused_lm_head": True,
                                        "__qualname__": cls.__qualname__,
                                        "__module__": cls.__module__})
    return _fused_classes.setdefault(cls, fused)


def _keep_lm_head_input(head, args):
    """lm_head's forward pre-hook: while its model is armed, keeps the hidden states and gives
    lm_head none. fp16 is left to the model: the gradients, computed in the forward for the loss's
    upstream gradient of 1/n before a loss scaler multiplies it, would fall into fp16's
    subnormals (bf16 and fp32 have the exponent range)."""
    if getattr(_fusion, "armed", None) is not head or not _runs_on_kjit(args[0]):
        return None
    hidden = args[0]
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    if dtype == torch.float16:
        return None
    _fusion.armed = None  # once a forward
    _fusion.kept = (hidden, head, _fusion.softcap)
    return (hidden[..., :0, :],) + tuple(args[1:])


def _runs_on_kjit(hidden: torch.Tensor) -> bool:
    return hidden.is_cuda


def _take_kept_lm_head_input():
    kept = getattr(_fusion, "kept", None)
    _fusion.kept = None
    return kept


def _fused_loss(kept, labels, num_items_in_batch, ignore_index, shift_labels):
    hidden, head, softcap = kept
    flat = hidden.reshape(-1, hidden.shape[-1])
    target = _shifted_target(labels, shift_labels, ignore_index, hidden.device)
    if target.shape[0] != flat.shape[0]:
        raise ValueError(f"kjit.apply_to(linear_cross_entropy=True): lm_head got "
                         f"{flat.shape[0]} positions but the labels hold {target.shape[0]}")
    # The dtype lm_head would have computed in: autocast's (fp32 master weights under bf16
    # autocast: the GEMMs in bf16, not fp32), else the hidden states'. Casts are differentiable, so
    # the gradients reach the weights in their own dtypes, as through autocast's linear.
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    flat, weight, bias = (t if t is None or t.dtype == dtype else t.to(dtype)
                          for t in (flat, head.weight, head.bias))
    if num_items_in_batch is None:
        return linear_cross_entropy(flat, weight, target, bias, ignore_index=ignore_index,
                                    softcap=softcap)
    # sum / n: the gradients are computed for the upstream 1 / n the division will send back, so
    # the backward's rescale finds nothing to do.
    count, scale = _count_and_upstream(num_items_in_batch, hidden.device)
    summed = linear_cross_entropy(flat, weight, target, bias, ignore_index=ignore_index,
                                  reduction="sum", softcap=softcap, grad_scale=scale)
    return summed / count


def _fuse_lm_head_and_loss(model: nn.Module) -> None:
    model.get_output_embeddings().register_forward_pre_hook(_keep_lm_head_input)
    model.__class__ = _fused_class(type(model))


def apply_to(model: nn.Module, *, rms_norm: bool = True, cross_entropy: bool = True,
             linear_cross_entropy: bool = False, inplace_backward: bool = True) -> dict:
    """Swaps the RMSNorm modules and the causal-LM loss of a Hugging Face LLaMA, Mistral,
    Mixtral, Phi-3, Qwen2, Qwen3 (and their MoE variants), Gemma or Gemma 2 model for kjit's;
    returns what it changed. Raises ValueError for a
    model it does not support (nothing is changed then).

    inplace_backward: the loss writes its gradient over the logits (the model's output logits
    then hold the gradient after a training forward); False allocates it instead.

    linear_cross_entropy: a training forward with labels (model.train(), labels=...) runs
    lm_head and the loss as kjit's fused op and computes no logits: its output's logits are
    empty ([batch, 0, vocab]); evaluation, generation and forwards without labels compute them
    as before. The op runs in the dtype lm_head would (autocast's, under autocast). lm_head must
    be a plain nn.Linear (not LoRA-wrapped or quantized) whose weight is whole in memory when
    the loss runs: not a separate FSDP unit, not ZeRO-3 partitioned.
    """
    if callable(getattr(model, "get_base_model", None)):
        model = model.get_base_model()  # a PEFT wrapper: the transformers model is underneath
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _SUPPORTED:
        raise ValueError(f"kjit.apply_to: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(_SUPPORTED))}")
    if (cross_entropy or linear_cross_entropy) and not (
            type(model).__name__.endswith("ForCausalLM") and hasattr(model, "loss_function")):
        raise ValueError(f"kjit.apply_to: {type(model).__name__} is not a causal LM with a "
                         "loss_function; pass cross_entropy=False (and no linear_cross_entropy) "
                         "to patch only the norms")
    casting, offset = _SUPPORTED[model_type]
    fuse = linear_cross_entropy and not getattr(model, "_kjit_fused_lm_head", False)
    if fuse:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if type(head) is not nn.Linear:
            raise ValueError(f"kjit.apply_to: linear_cross_entropy needs lm_head to be a plain "
                             f"nn.Linear, got {type(head).__name__}; pass "
                             "linear_cross_entropy=False")
    if rms_norm:  # checked before anything changes
        for name, module in _hf_norms(model):
            _norm_eps(name, module)
    changed = {"model_type": model_type, "rms_norm": [], "loss": None,
               "linear_cross_entropy": fuse or getattr(model, "_kjit_fused_lm_head", False)}
    if rms_norm:
        changed["rms_norm"] = _replace_norms(model, casting, offset)
    if cross_entropy or fuse:
        original = model.loss_function
        model.loss_function = _CausalLMLoss(original, cross_entropy, inplace_backward)
        changed["loss"] = (f"{getattr(original, '__name__', type(original).__name__)} -> kjit"
                           + (" (lm_head fused)" if fuse else ""))
    if fuse:
        if "forward" in vars(model):
            warnings.warn("kjit.apply_to: this model's forward was replaced on the instance (by "
                          "accelerate or a hook library?); the fused lm_head arms in its class's "
                          "forward and will not run unless that is called", stacklevel=2)
        _fuse_lm_head_and_loss(model)
    return changed
