"""apply_to(model): kjit's RMSNorm and cross-entropy in a Hugging Face causal LM, in place.

    model = AutoModelForCausalLM.from_config(config).cuda()
    changed = kjit.torch.apply_to(model)   # {"model_type": "llama", "rms_norm": [...], "loss": ...}
    model(input_ids, labels=labels).loss.backward()

Each RMSNorm module becomes a kjit one holding the same weight Parameter (state dicts and
optimizers are unaffected) and computing what the original rounds where it rounds it; the
model's loss function becomes kjit's fused cross-entropy over the model's logits, without the
fp32 copy of the logits Hugging Face's loss makes. Gemma 2's logit soft-cap stays in the model's
forward.

A training forward never hands out the loss's gradient as its logits: by default the gradient
has a buffer of its own and the output's logits are the model's (inplace_backward=True writes
the gradient over them and empties the output's logits, [batch, 0, vocab], so that no caller
reads it as logits). With metrics=True the output also carries what kjit computed beside the
loss, on the device: outputs.kjit_metrics = {"token_accuracy", "entropy", "num_tokens"} (0-d
tensors over the tokens whose label counts), so a trainer can log accuracy and entropy without
the logits (which the fused lm_head never computes).

Where kjit cannot run a call, the patched module runs the original code and says so: tensors not
on a CUDA GPU, a dtype kjit's kernels do not take (float64), a LLaMA-style norm whose weight dtype
differs from its input's (whose output torch would promote), a float16 forward of the fused
lm_head, and a final_logit_softcapping that is not > 0 (left to the model's forward). So is a
training forward that reaches the decoder outside the model's forward with labels (TRL's
SFTTrainer): kjit's loss never runs there. Each reason is a KjitFallbackWarning once per model
(under torch.compile, while the call is traced); apply_to(model, strict=True) raises
KjitFallbackError instead. apply_to's "runs" says what runs for the model as it is then.

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
import json
import sys
import threading
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from kjit._runtime import KjitWarning
from kjit.torch._common import is_dtensor
from kjit.torch.functional import cross_entropy, linear_cross_entropy, rms_norm

# The model families apply_to supports, by model_type: kjit/model_families.json, the table kjit-tune
# --config reads too (it embeds the file), so that kjit-tune prepares the kernels apply_to runs. The
# file says what each entry means. Left out, and why (transformers 5.25): Cohere and Cohere 2
# (LayerNorms; logits times logit_scale), Phi (LayerNorm), Gemma 3n (weightless norms by
# pow(-0.5), not checked), Gemma 3's and Llama 4's multimodal wrappers (their text models,
# gemma3_text and llama4_text, are in), Granite 4 (granitemoehybrid: Mamba layers with gated norms,
# not checked), Qwen3-Next (gated norms, not checked). QK-norms of other sizes (OLMo 2's over all
# heads, Gemma 3's and Qwen 3's over one, DeepSeek's over its LoRA ranks) and Qwen 2.5 VL's vision
# norms are the same code as the family's RMSNorm.
MODEL_FAMILIES_FILE = Path(__file__).resolve().parents[2] / "model_families.json"
_FAMILIES = json.loads(MODEL_FAMILIES_FILE.read_text(encoding="utf-8"))["families"]

# model_type -> the RMSNorm flavour its norms compute (casting, weight offset).
_SUPPORTED = {name: (family["norm_casting"], float(family.get("norm_weight_offset", 0.0)))
              for name, family in _FAMILIES.items()}

# The model types whose ...ForConditionalGeneration computes the loss as a causal LM's: lm_head's
# output to the loss, unchanged (the Qwen vision-language models on text and images).
_CONDITIONAL_CAUSAL_LM = tuple(name for name, family in _FAMILIES.items()
                               if family.get("conditional_causal_lm", False))

# The model types whose forward soft-caps the logits by config.final_logit_softcapping (when set;
# a config of another type may carry the key without its forward reading it).
_SOFTCAPPED = tuple(name for name, family in _FAMILIES.items()
                    if family.get("softcaps_logits", False))

# model_type -> the config value its forward divides lm_head's output by. The fused path divides
# the hidden states instead: the same logits, bit for bit when the value is a power of two (16 in
# Granite 3's 8B config), else within one rounding of the hidden states.
_LOGITS_DIVIDED_BY = {name: family["logits_divided_by"] for name, family in _FAMILIES.items()
                      if "logits_divided_by" in family}

# RMSNorm classes apply_to leaves to Hugging Face's code: Llama 4's QK-norm has no weight (x in
# fp32, normalized, rounded once), and kjit's rms_norm needs one.
_NORMS_LEFT_ALONE = ("Llama4TextWeightlessRMSNorm",)


class KjitFallbackWarning(KjitWarning):
    """A module apply_to patched ran the original code for a call kjit cannot take."""


class KjitFallbackError(RuntimeError):
    """apply_to(model, strict=True): a patched module got a call kjit cannot take."""


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _not_for_kjit(t: torch.Tensor):
    """(reason, why) when kjit's kernels cannot take tensors like t, else None. One reason per
    cause, whichever module meets it, so that a model on the CPU warns once, not once a module."""
    if not t.is_cuda:
        return (f"device {t.device.type}",
                f"its tensors are on {t.device.type}, not on a CUDA GPU; move the model to the GPU "
                "(model.cuda()) for kjit's kernels")
    if t.dtype not in _KERNEL_DTYPES:
        return (f"dtype {t.dtype}",
                f"its tensors are {t.dtype}, which kjit's kernels do not take (float32, float16 "
                "and bfloat16)")
    return None


class _Fallbacks:
    """One patched model's calls that run the original code: each reason is warned once (strict:
    raised). Shared by the model's patched modules and kept on the model (copies get their own)."""

    def __init__(self, model_name: str, strict: bool):
        self.model_name, self.strict, self.warned = model_name, strict, set()

    def original_runs(self, reason: str, what_runs: str, why: str) -> None:
        """Says that `what_runs` instead of kjit, for `why`, unless `reason` was said already."""
        message = f"{self.model_name}: {what_runs}: {why}"
        if self.strict:
            raise KjitFallbackError(f"kjit.apply_to(strict=True): {message}")
        if reason not in self.warned:
            self.warned.add(reason)
            message = f"kjit.apply_to: {message} (said once per model and cause)"
            if torch.compiler.is_compiling():
                # torch.compile cannot trace warnings.warn (fullgraph=True fails on it): said
                # while the call is traced instead. (Imported here: dynamo is loaded by now.)
                from torch._dynamo.comptime import comptime
                comptime(_warn_while_tracing)
            else:
                warnings.warn(message, KjitFallbackWarning, stacklevel=2)


def _warn_while_tracing(ctx) -> None:
    """_Fallbacks.original_runs's warning, at torch.compile's trace of it (a comptime function:
    ctx is the traced frame, whose `message` is a constant)."""
    warnings.warn(ctx.get_local("message").as_python_constant(), KjitFallbackWarning)


class KjitHFRMSNorm(nn.Module):
    """Stands in for a Hugging Face RMSNorm module, sharing its weight; its fallback runs the
    original's code with the weight this module holds when it runs."""

    def __init__(self, original: nn.Module, eps: float, casting: str, offset: float,
                 fallbacks: _Fallbacks):
        super().__init__()
        self.weight = original.weight
        self.eps = eps
        self.casting = casting
        self.offset = offset
        self.fallbacks = fallbacks
        # Not a submodule: its weight is ours, and it must not appear twice in parameters().
        object.__setattr__(self, "original", original)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cannot = _not_for_kjit(x) or _not_for_kjit(self.weight)
        if cannot is None and self.casting == "llama" and self.weight.dtype != x.dtype:
            cannot = (f"promotes {self.weight.dtype} {x.dtype}",
                      f"an RMSNorm with {self.weight.dtype} weight got {x.dtype} input, and torch "
                      "would promote its output")
        if cannot is not None:
            self.fallbacks.original_runs(cannot[0], "RMSNorm runs Hugging Face's code", cannot[1])
            # With this module's weight as it is now, not the one the original kept:
            # load_state_dict(assign=True), fully_shard and to() may have replaced it since.
            return torch.func.functional_call(self.original, {"weight": self.weight}, (x,))
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
            if type(module).__name__.endswith("RMSNorm") and not isinstance(module, KjitHFRMSNorm)
            and type(module).__name__ not in _NORMS_LEFT_ALONE]


def _replace_norms(model: nn.Module, casting: str, offset: float, fallbacks: _Fallbacks) -> list:
    replaced = []
    for name, module in _hf_norms(model):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child,
                KjitHFRMSNorm(module, _norm_eps(name, module), casting, offset, fallbacks))
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


# The extras of kjit's loss that become outputs.kjit_metrics, and their names there.
_METRICS = {"token_accuracy": "token_accuracy", "mean_entropy": "entropy",
            "num_tokens": "num_tokens"}


def _metrics_of(out) -> dict:
    """outputs.kjit_metrics from a LossOutput."""
    return {name: getattr(out, field) for field, name in _METRICS.items()}


def _metrics_from_logits(logits: torch.Tensor, target: torch.Tensor, ignore_index: int) -> dict:
    """outputs.kjit_metrics computed by torch from the logits, where Hugging Face's loss ran
    (detached; the same definitions as kjit's)."""
    with torch.no_grad():
        flat = logits.reshape(-1, logits.shape[-1]).float()
        target = target.to(flat.device)
        valid = (target != ignore_index) & (target >= 0) & (target < flat.shape[-1])
        count = valid.sum()
        logp = torch.log_softmax(flat, dim=-1)
        entropy = -(logp.exp() * torch.where(logp.isinf(), 0.0, logp)).sum(-1)
        hits = (valid & (flat.argmax(-1) == target)).sum()
        n = count.to(torch.float32)
        return {"token_accuracy": hits.to(torch.float32) / n,
                "entropy": torch.where(valid, entropy, 0.0).sum() / n, "num_tokens": count}


def _report(**what) -> None:
    """Tells the model's forward (when it is kjit's, _fused_class) what the loss did: the logits
    it wrote the gradient over, the metrics it computed."""
    report = getattr(_fusion, "report", None)
    if report is not None:
        report.update(what)


class _CausalLMLoss:
    """Hugging Face's ForCausalLMLoss (shift, flatten, mean or sum / num_items_in_batch) on kjit's
    fused lm_head + cross-entropy when a fused forward kept lm_head's input, else on kjit's
    cross-entropy over the logits (use_kjit) or the original. An object rather than a closure, so
    that a patched model still pickles (torch.save(model))."""

    def __init__(self, original, use_kjit: bool, inplace_backward: bool, fallbacks: _Fallbacks,
                 metrics: bool = False):
        self.original, self.use_kjit, self.inplace_backward = original, use_kjit, inplace_backward
        self.fallbacks, self.metrics = fallbacks, metrics
        self.__name__ = getattr(original, "__name__", type(original).__name__)

    def __call__(self, logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                 shift_labels=None, **kwargs):
        extras = tuple(_METRICS) if getattr(self, "metrics", False) else False
        kept = _take_kept_lm_head_input()
        if kept is not None:
            return _fused_loss(kept, labels, num_items_in_batch, ignore_index, shift_labels,
                               extras)
        cannot = _not_for_kjit(logits) if self.use_kjit else None
        if cannot is not None:
            self.fallbacks.original_runs(cannot[0], f"the loss runs Hugging Face's {self.__name__}",
                                         cannot[1])
        if not self.use_kjit or cannot is not None:
            if extras:
                target = _shifted_target(labels, shift_labels, ignore_index, logits.device)
                _report(metrics=_metrics_from_logits(logits, target, ignore_index))
            return self.original(logits, labels, vocab_size,
                                 num_items_in_batch=num_items_in_batch,
                                 ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        target = _shifted_target(labels, shift_labels, ignore_index, logits.device)
        flat = logits.reshape(-1, vocab_size)  # a view of lm_head's output, a copy if it must
        # In place only where the forward can hide the logits from its caller (_fused_class).
        inplace = self.inplace_backward and getattr(_fusion, "report", None) is not None
        options = dict(ignore_index=ignore_index, inplace_backward=inplace, extras=extras)
        if num_items_in_batch is None:
            loss = cross_entropy(flat, target, **options)
        else:
            # sum / n: the gradient is computed for the upstream 1 / n the division will send
            # back.
            count, scale = _count_and_upstream(num_items_in_batch, logits.device)
            loss = cross_entropy(flat, target, reduction="sum", grad_scale=scale, **options)
        if extras:
            _report(metrics=_metrics_of(loss))
            loss = loss.loss
        if inplace and flat.requires_grad and torch.is_grad_enabled():
            _report(overwritten=logits)
        return loss if num_items_in_batch is None else loss / count


# ---- lm_head and the loss fused ---------------------------------------------------------------

# armed: the lm_head whose input to keep (None: none), with softcap and its model's _Fallbacks;
# then kept: (hidden, lm_head, softcap). report: a dict while a kjit model's forward runs, which
# the loss fills (_report).
_fusion = threading.local()
_fused_classes: dict = {}


def _hide_overwritten_logits(out, logits: torch.Tensor):
    """The model's output with the logits the loss wrote its gradient over replaced by an empty
    view ([batch, 0, vocab]), wherever they appear (a ModelOutput's field, a tuple's element)."""
    empty = logits[..., :0, :]
    if isinstance(out, tuple):
        return type(out)(empty if o is logits else o for o in out)
    for key in [k for k, v in out.items() if v is logits]:
        out[key] = empty
    return out


def _fused_class(cls: type) -> type:
    """cls with a forward that arms the fusion around cls.forward (for a model whose lm_head is
    fused) and hands the loss's report to the output: metrics on it, logits the gradient went
    over hidden; one per class."""
    fused = _fused_classes.get(cls)
    if fused is not None:
        return fused

    # With cls.forward's signature, which Trainer (the dataset columns it keeps) and generation
    # (the arguments the model takes) read.
    @functools.wraps(cls.forward)
    def forward(self, *args, **kwargs):
        if kwargs.get("labels") is None:
            return cls.forward(self, *args, **kwargs)
        keep = kwargs.get("logits_to_keep", 0)
        fuse = (getattr(self, "_kjit_fuse_lm_head", False) and self.training
                and isinstance(keep, int) and keep == 0)
        # Only _SOFTCAPPED forwards soft-cap the logits (a config may carry the key regardless);
        # one that kjit's soft-cap does not take (<= 0, NaN) is left to Hugging Face's forward.
        model_type = self.config.model_type
        softcap = getattr(self.config, "final_logit_softcapping", None) \
            if model_type in _SOFTCAPPED else None
        if fuse and softcap is not None and not softcap > 0:
            self._kjit_fallbacks.original_runs(
                f"final_logit_softcapping {softcap}", "lm_head computes the logits, unfused",
                f"its config's final_logit_softcapping is {softcap}, which Hugging Face's "
                "forward applies as it is (softcap * tanh(logits / softcap)) and kjit's fused "
                "soft-cap does not take (it must be > 0)")
            fuse = False
        # Armed for this model's own lm_head only, so that another model's forward inside this one
        # (a teacher's, from a hook) computes its logits; the outer state comes back afterwards.
        outer = (getattr(_fusion, "armed", None), getattr(_fusion, "softcap", 0.0),
                 getattr(_fusion, "divisor", 1.0), getattr(_fusion, "fallbacks", None),
                 getattr(_fusion, "kept", None), getattr(_fusion, "report", None))
        _fusion.armed, _fusion.kept = (self.get_output_embeddings() if fuse else None), None
        _fusion.fallbacks = self._kjit_fallbacks
        _fusion.report = report = {}
        _fusion.softcap = softcap or 0.0
        divided_by = _LOGITS_DIVIDED_BY.get(model_type)
        _fusion.divisor = float(getattr(self.config, divided_by)) if divided_by else 1.0
        try:
            out = cls.forward(self, *args, **kwargs)
        finally:
            (_fusion.armed, _fusion.softcap, _fusion.divisor, _fusion.fallbacks, _fusion.kept,
             _fusion.report) = outer
        if report.get("overwritten") is not None:
            out = _hide_overwritten_logits(out, report["overwritten"])
        if "metrics" in report:
            _fusion.metrics = report["metrics"]  # for take_metrics()
            if not isinstance(out, tuple):
                out.kjit_metrics = report["metrics"]
        return out

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
                                        "_kjit_forward": True,
                                        "__qualname__": cls.__qualname__,
                                        "__module__": cls.__module__})
    return _fused_classes.setdefault(cls, fused)


def take_metrics():
    """The kjit_metrics of this thread's last forward with labels of a model patched with
    apply_to(metrics=True), or None; the call clears them. For trainers whose wrappers rebuild the
    model's output without its attributes: accelerate's mixed-precision forward (Trainer with
    bf16=True, TRL's SFTConfig default) returns a new output, converted to fp32."""
    metrics = getattr(_fusion, "metrics", None)
    _fusion.metrics = None
    return metrics


def _keep_lm_head_input(head, args):
    """lm_head's forward pre-hook: while its model is armed, keeps the hidden states and gives
    lm_head none. fp16 is left to the model: the gradients, computed in the forward for the loss's
    upstream gradient of 1/n before a loss scaler multiplies it, would fall into fp16's
    subnormals (bf16 and fp32 have the exponent range)."""
    if getattr(_fusion, "armed", None) is not head:
        return None
    if _fsdp_unit(head):  # refused whether the fused op or lm_head would run
        raise ValueError(f"kjit.apply_to(linear_cross_entropy=True): {_OWN_FSDP_UNIT}")
    hidden = args[0]
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    cannot = _fused_cannot_take(hidden, dtype)
    if cannot is not None:
        _fusion.fallbacks.original_runs(cannot[0], "lm_head computes the logits, unfused",
                                        cannot[1])
        return None
    _fusion.armed = None  # once a forward
    # (lm_head(hidden) / d == lm_head(hidden / d): Granite's logits scaling, _LOGITS_DIVIDED_BY)
    divisor = _fusion.divisor
    _fusion.kept = (hidden if divisor == 1.0 else hidden / divisor, head, _fusion.softcap)
    return (hidden[..., :0, :],) + tuple(args[1:])


def _fused_cannot_take(hidden: torch.Tensor, dtype: torch.dtype):
    """_not_for_kjit for the fused lm_head + loss, whose hidden states compute in `dtype`."""
    if dtype == torch.float16:
        return ("fused float16",
                "a float16 training forward is not fused: the gradients, computed for the loss's "
                "1/n before a loss scaler multiplies them, would fall into float16's subnormals "
                "(train in bfloat16 to fuse)")
    return None if _runs_on_kjit(hidden) else _not_for_kjit(hidden)


def _runs_on_kjit(hidden: torch.Tensor) -> bool:
    # The CPU tests replace this to run the fused plumbing on CPU tensors.
    return _not_for_kjit(hidden) is None


def _take_kept_lm_head_input():
    kept = getattr(_fusion, "kept", None)
    _fusion.kept = None
    return kept


# Why the fused lm_head cannot take a lm_head that FSDP2 shards as a unit of its own, and what to
# do instead.
_OWN_FSDP_UNIT = (
    "lm_head is a fully_shard unit of its own: FSDP2 reshards its weight as soon as lm_head's "
    "forward returns, before the fused loss runs, and the fused loss would get the weight's local "
    "shard. Keep lm_head in its parent's unit (fully_shard the decoder layers and then the whole "
    "model, not model.lm_head), whose weights stay unsharded for the model's forward, the loss "
    "included; or pass linear_cross_entropy=False")


def _fsdp_unit(module: nn.Module) -> bool:
    """Whether fully_shard made `module` a unit of its own (FSDP2)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, getattr(fsdp, "FSDPModule", ()))


def _zero3_partitioned(weight: torch.Tensor) -> bool:
    """Whether DeepSpeed ZeRO-3 holds `weight` partitioned (its data an empty placeholder)."""
    return getattr(weight, "ds_id", None) is not None and weight.numel() == 0


def _fused_loss(kept, labels, num_items_in_batch, ignore_index, shift_labels, extras=False):
    hidden, head, softcap = kept
    if is_dtensor(head.weight):
        raise ValueError(f"kjit.apply_to(linear_cross_entropy=True): lm_head's weight is a "
                         f"DTensor (placements {tuple(head.weight.placements)}) when the loss "
                         f"runs. {_OWN_FSDP_UNIT}")
    if _zero3_partitioned(head.weight):
        raise ValueError("kjit.apply_to(linear_cross_entropy=True): lm_head's weight is "
                         "partitioned by DeepSpeed ZeRO-3 when the loss runs (released after "
                         "lm_head's forward); gather it around the step "
                         "(with deepspeed.zero.GatheredParameters(model.lm_head.weight, "
                         "modifier_rank=None): ...) or pass linear_cross_entropy=False")
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
    options = dict(ignore_index=ignore_index, softcap=softcap)
    if extras:
        options["extras"] = extras
    if num_items_in_batch is None:
        loss = linear_cross_entropy(flat, weight, target, bias, **options)
    else:
        # sum / n: the gradients are computed for the upstream 1 / n the division will send
        # back, so the backward's rescale finds nothing to do.
        count, scale = _count_and_upstream(num_items_in_batch, hidden.device)
        loss = linear_cross_entropy(flat, weight, target, bias, reduction="sum",
                                    grad_scale=scale, **options)
    if extras:
        _report(metrics=_metrics_of(loss))
        loss = loss.loss
    return loss if num_items_in_batch is None else loss / count


def _wrap_forward(model: nn.Module) -> None:
    """The model's class becomes kjit's subclass (_fused_class), once."""
    if not getattr(type(model), "_kjit_forward", False):
        model.__class__ = _fused_class(type(model))


def _fuse_lm_head_and_loss(model: nn.Module) -> None:
    head = model.get_output_embeddings()
    if _keep_lm_head_input not in head._forward_pre_hooks.values():
        head.register_forward_pre_hook(_keep_lm_head_input)
    model._kjit_fuse_lm_head = True
    _wrap_forward(model)


class _DecoderOutsideTheModelsForward:
    """The decoder's forward pre-hook (model.base_model's) in a model whose loss is kjit's: a
    training forward with gradients that reaches the decoder outside the model's own forward with
    labels computes its loss elsewhere, so kjit's never runs: said once per model (strict:
    raised). TRL's SFTTrainer does so: its fused LM head calls the decoder itself. An object, so
    that the model still pickles."""

    def __init__(self, fallbacks: _Fallbacks):
        self.fallbacks = fallbacks

    def __call__(self, decoder, args):
        outside = getattr(_fusion, "report", None) is None  # (set by the forward with labels)
        if decoder.training and torch.is_grad_enabled() and outside:
            self.fallbacks.original_runs(
                "loss outside the model's forward", "kjit's loss never runs",
                "a training forward reached the decoder without the model's own forward with "
                "labels, which is where the loss is kjit's (TRL's SFTTrainer computes its own loss "
                "through its fused LM head; a training loop may compute one from the logits): "
                "with TRL use kjit.torch.trl.KjitSFTTrainer, else call the model with labels=")


def _watch_the_decoder(model: nn.Module, fallbacks: _Fallbacks) -> None:
    decoder = getattr(model, "base_model", None)
    if isinstance(decoder, nn.Module) and decoder is not model and not any(
            isinstance(hook, _DecoderOutsideTheModelsForward)
            for hook in decoder._forward_pre_hooks.values()):
        decoder.register_forward_pre_hook(_DecoderOutsideTheModelsForward(fallbacks))


def _what_runs(model: nn.Module, norms: bool, loss_name, use_kjit: bool, fused: bool) -> dict:
    """What each patched part runs for the model's parameters as they are now (apply_to may come
    before model.cuda(); each call decides for its own tensors, as _not_for_kjit says)."""
    probe = next(model.parameters(), None)
    if probe is None:
        return {}
    cannot = _not_for_kjit(probe)
    runs = {}
    if norms:
        runs["rms_norm"] = "kjit" if cannot is None else f"Hugging Face's code: {cannot[1]}"
    if loss_name is None:
        return runs
    loss = "kjit's cross-entropy over the logits" if use_kjit and cannot is None else \
        f"Hugging Face's {loss_name}" + (f": {cannot[1]}" if cannot else "")
    unfused = _fused_cannot_take(probe, probe.dtype) if fused else None
    if fused and unfused is None:
        loss = f"kjit's fused lm_head + cross-entropy in training forwards with labels, else {loss}"
    elif fused and cannot is None:
        loss += f" (lm_head unfused: {unfused[1]})"
    runs["loss"] = loss
    return runs


def apply_to(model: nn.Module, *, rms_norm: bool = True, cross_entropy: bool = True,
             linear_cross_entropy: bool = False, inplace_backward: bool = False,
             metrics: bool = False, strict: bool = False) -> dict:
    """Swaps the RMSNorm modules and the causal-LM loss of a Hugging Face model for kjit's: the
    model types of _SUPPORTED (LLaMA and Llama 4's text model, Mistral, Ministral, Mixtral, Phi-3,
    Qwen2, Qwen3 (and their MoE variants), Qwen 2.5 VL and Qwen 3 VL, Granite (and its MoE),
    DeepSeek V2 and V3, OLMo 2, 3 and OLMoE, Gemma, Gemma 2, Gemma 3's text model, gpt-oss,
    SmolLM3, GLM-4, Seed-OSS, Arcee, Apertus, EXAONE 4, ERNIE 4.5, Hunyuan dense, Helium);
    returns what it changed ("rms_norm": the norms' names, "loss", "linear_cross_entropy") and
    what runs for the model as it is now ("runs": {"rms_norm": ..., "loss": ...}, e.g. Hugging
    Face's code for a model still on the CPU). Raises ValueError for a model it does not support
    (nothing is changed then).

    A call kjit cannot take (tensors not on a CUDA GPU, float64, a LLaMA norm whose weight and
    input dtypes differ, a float16 forward of the fused lm_head, a final_logit_softcapping not
    > 0) runs the original code with a KjitFallbackWarning, once per model and cause, as does a
    training forward that reaches the decoder outside the model's forward with labels (TRL's
    SFTTrainer: kjit's loss never runs); strict=True raises KjitFallbackError instead.

    inplace_backward: False (default) gives the loss's gradient a buffer of its own ([tokens,
    vocab] in the logits' dtype, alive from the forward to the backward): the output's logits
    are the model's. True writes the gradient over the logits instead (no such buffer) and
    replaces the output's logits by an empty [batch, 0, vocab] view, so that nothing reads the
    gradient as logits; code that needs a training forward's logits then breaks loudly.

    metrics: the output of a forward with labels carries kjit_metrics, {"token_accuracy":
    predicted == label over the counted tokens, "entropy": the mean entropy of the predicted
    distributions over them, "num_tokens": their number} as 0-d device tensors computed with the
    loss (the predicted token and entropy from the same pass over the logits; where Hugging
    Face's loss runs, from its logits by torch). Off by default: kjit's kernels for them have
    not yet run on a GPU.

    linear_cross_entropy: a training forward with labels (model.train(), labels=...) runs
    lm_head and the loss as kjit's fused op and computes no logits: its output's logits are
    empty ([batch, 0, vocab]); evaluation, generation and forwards without labels compute them
    as before. The op runs in the dtype lm_head would (autocast's, under autocast). lm_head must
    be a plain nn.Linear (not LoRA-wrapped or quantized) whose weight is whole in memory when
    the loss runs. Under FSDP2 that holds when lm_head belongs to its parent's fully_shard unit
    (fully_shard the layers, then the model); a lm_head that is a unit of its own is refused
    with ValueError (here when fully_shard came first, else at the loss), as is a weight that is
    a DTensor when the loss runs, rather than computing on its local shard. Under DeepSpeed
    ZeRO-3 the weight must be gathered around the forward (deepspeed.zero.GatheredParameters).
    """
    if callable(getattr(model, "get_base_model", None)):
        model = model.get_base_model()  # a PEFT wrapper: the transformers model is underneath
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in _SUPPORTED:
        raise ValueError(f"kjit.apply_to: model_type {model_type!r} is not supported; supported: "
                         f"{', '.join(sorted(_SUPPORTED))}")
    if (cross_entropy or linear_cross_entropy) and not (
            (type(model).__name__.endswith("ForCausalLM") or model_type in _CONDITIONAL_CAUSAL_LM)
            and hasattr(model, "loss_function")):
        raise ValueError(f"kjit.apply_to: {type(model).__name__} is not a causal LM with a "
                         "loss_function; pass cross_entropy=False (and no linear_cross_entropy) "
                         "to patch only the norms")
    casting, offset = _SUPPORTED[model_type]
    fuse = linear_cross_entropy and not getattr(model, "_kjit_fuse_lm_head", False)
    if fuse:
        head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
        if _fsdp_unit(head):
            raise ValueError(f"kjit.apply_to: {_OWN_FSDP_UNIT}")
        if type(head) is not nn.Linear:
            raise ValueError(f"kjit.apply_to: linear_cross_entropy needs lm_head to be a plain "
                             f"nn.Linear, got {type(head).__name__}; pass "
                             "linear_cross_entropy=False")
    if rms_norm:  # checked before anything changes
        for name, module in _hf_norms(model):
            _norm_eps(name, module)
    fallbacks = getattr(model, "_kjit_fallbacks", None) or _Fallbacks(type(model).__name__, strict)
    fallbacks.strict = strict  # an earlier apply_to's modules share it
    model._kjit_fallbacks = fallbacks
    fused = fuse or getattr(model, "_kjit_fuse_lm_head", False)
    changed = {"model_type": model_type, "rms_norm": [], "loss": None,
               "linear_cross_entropy": fused}
    if rms_norm:
        changed["rms_norm"] = _replace_norms(model, casting, offset, fallbacks)
    loss_name = None
    if cross_entropy or fuse:
        original = model.loss_function
        if isinstance(original, _CausalLMLoss):  # apply_to again: the options are the new ones
            original = original.original
        model.loss_function = _CausalLMLoss(original, cross_entropy, inplace_backward, fallbacks,
                                            metrics)
        loss_name = model.loss_function.__name__
        changed["loss"] = f"{loss_name} -> kjit" + (" (lm_head fused)" if fuse else "")
    norms = any(isinstance(m, KjitHFRMSNorm) for m in model.modules())
    changed["runs"] = _what_runs(model, norms, loss_name, cross_entropy, fused)
    if loss_name is not None:
        if "forward" in vars(model):
            warnings.warn("kjit.apply_to: this model's forward was replaced on the instance (by "
                          "accelerate or a hook library?); the fused lm_head, the metrics and an "
                          "in-place gradient's hidden logits need its class's forward, which "
                          "will not run unless that is called", stacklevel=2)
        _wrap_forward(model)
        _watch_the_decoder(model, fallbacks)
    if fuse:
        _fuse_lm_head_and_loss(model)
    return changed
