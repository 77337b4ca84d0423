"""TRL's SFTTrainer on kjit's loss, and TRL's GRPOTrainer on kjit's RL heads.

    import kjit.torch
    from kjit.torch.integrations.trl import KjitSFTTrainer

    kjit.torch.apply_to(model, metrics=True)      # first: TRL wraps the forward apply_to arms
    trainer = KjitSFTTrainer(model=model, args=trl.SFTConfig(...), train_dataset=data,
                             processing_class=tokenizer)
    trainer.train()

TRL's SFTTrainer (1.16) computes its loss itself, from the per-token log-probabilities of its
own fused LM head (model(..., fused_lm_head=True)), so the model's loss, and with it kjit's, never
runs; TRL's advice for another loss is a subclass that overrides compute_loss. KjitSFTTrainer (or
KjitSFTMixin before your own SFTTrainer subclass) does that: each step is the model's own forward
with labels, as transformers' Trainer runs it (num_items_in_batch, average_tokens_across_devices),
so the loss is kjit's (cross-entropy over the logits, or the fused lm_head + loss with
apply_to(linear_cross_entropy=True)), and TRL's logged "entropy" and "mean_token_accuracy" come from
kjit's loss pass (outputs.kjit_metrics), gathered across processes and averaged over the steps
between two logs as TRL averages its own; "num_tokens" is counted as TRL counts it. For MoE models
the router's auxiliary loss is the model's own, added to each micro-batch's loss as its forward
adds it (TRL divides it by the gradient-accumulation steps when it counts num_items_in_batch).

Where TRL's loss is not the plain token-mean cross-entropy (loss_type="dft", a compute_loss_func,
label_smoothing_factor) or runs elsewhere (DeepSpeed's Ulysses sequence parallelism), the step is
TRL's own, with a KjitWarning saying so once.

    from kjit.torch.integrations.trl import KjitGRPOTrainer
    KjitGRPOTrainer(model=model, reward_funcs=reward, args=trl.GRPOConfig(...),
                    train_dataset=prompts).train()

KjitGRPOTrainer (KjitGRPOMixin) computes GRPO's per-token log-probabilities and entropies (the
policy's, and the old and reference policies' without gradients) with kjit.torch.linear_log_probs
from the hidden states, at the trainer's temperature, in place of TRL's fused LM head; the rest of
the step is TRL's (see KjitChunkedLogProb for what keeps TRL's head).
"""

from __future__ import annotations

import warnings

import torch
import transformers
import trl

from kjit._runtime import KjitWarning
from kjit.torch.integrations.hf import take_metrics


class KjitSFTMixin:
    """Put before SFTTrainer (or a subclass of it): class T(KjitSFTMixin, trl.SFTTrainer)."""

    def _kjit_cannot_run(self):
        """Why this trainer's loss is not one kjit computes, or None."""
        if self.args.loss_type != "nll":
            return f"loss_type={self.args.loss_type!r}"
        if self.compute_loss_func is not None:
            return "a compute_loss_func"
        if self.label_smoother is not None:
            return "label_smoothing_factor"
        pc = getattr(self.accelerator, "parallelism_config", None)
        if pc is not None and pc.sp_backend == "deepspeed" and pc.sp_enabled:
            return "DeepSpeed sequence parallelism"
        return None

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        cannot = self._kjit_cannot_run()
        if cannot is not None:
            if not getattr(self, "_kjit_said", False):
                self._kjit_said = True
                warnings.warn(f"kjit.torch.trl: with {cannot}, SFTTrainer computes its own loss "
                              "and metrics; kjit's loss does not run", KjitWarning, stacklevel=2)
            return super().compute_loss(model, inputs, return_outputs=return_outputs,
                                        num_items_in_batch=num_items_in_batch)
        mode = "train" if self.model.training else "eval"
        inputs["use_cache"] = False
        if self.aux_loss_enabled:
            inputs["output_router_logits"] = True
        # The model's own forward with labels (not SFTTrainer's fused head): kjit's loss. Its
        # metrics from take_metrics(): under mixed precision accelerate rebuilds the output.
        take_metrics()
        loss, outputs = transformers.Trainer.compute_loss(
            self, model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        metrics = take_metrics()
        if metrics is None:
            raise RuntimeError(
                "kjit.torch.trl: the model's forward gave no kjit_metrics; call "
                "kjit.torch.apply_to(model, metrics=True) before creating the trainer (TRL wraps "
                "the model's forward when the trainer is created)")
        self._kjit_log_step(mode, metrics, inputs, outputs)
        return (loss, outputs) if return_outputs else loss

    def _kjit_log_step(self, mode: str, metrics: dict, inputs: dict, outputs) -> None:
        """SFTTrainer's per-step metrics, from kjit's: the sums over every process, read back
        once (as TRL reads its own)."""
        count = metrics["num_tokens"].detach().to(torch.float32)
        local = torch.stack([count, torch.nan_to_num(metrics["entropy"].detach().float() * count),
                             torch.nan_to_num(metrics["token_accuracy"].detach().float() * count)])
        num_valid, entropy_sum, num_correct = (
            self.accelerator.gather_for_metrics(local).reshape(-1, 3).sum(0).tolist())
        self._metrics[mode]["entropy"].append(entropy_sum / num_valid if num_valid > 0 else 0.0)
        self._metrics[mode]["mean_token_accuracy"].append(
            num_correct / num_valid if num_valid > 0 else 0.0)
        if mode == "train":
            if "attention_mask" in inputs:
                local_tokens = inputs["attention_mask"].sum()
            elif "position_ids" in inputs:  # padding-free batches
                local_tokens = torch.tensor(inputs["position_ids"].size(1),
                                            device=inputs["position_ids"].device)
            else:
                raise ValueError("kjit.torch.trl: expected 'attention_mask' or 'position_ids' in "
                                 "the inputs (to count num_tokens)")
            tokens = int(self.accelerator.gather_for_metrics(local_tokens).sum().item())
            self._total_train_tokens += tokens // self._tp_size
        self._metrics[mode]["num_tokens"] = [self._total_train_tokens]
        if self.aux_loss_enabled and getattr(outputs, "aux_loss", None) is not None:
            aux = self.accelerator.gather_for_metrics(outputs.aux_loss.detach())
            self._metrics[mode]["aux_loss"].append(aux.mean().item())


class KjitSFTTrainer(KjitSFTMixin, trl.SFTTrainer):
    """trl.SFTTrainer whose loss, entropy and mean_token_accuracy are kjit's (KjitSFTMixin)."""


# ---- GRPO (and every TRL trainer on TRL's fused LM head) -----------------------------------------

def _trl_chunked_module():
    """The module whose ChunkedLogProbFunction TRL's fused LM head calls (trl.trainer.utils
    imports it as _ChunkedLogProbFunction and looks it up on each call), or None for a TRL
    without it."""
    import trl.trainer.utils as utils
    return utils if hasattr(utils, "_ChunkedLogProbFunction") else None


def _kjit_runs_on(device: torch.device) -> bool:
    """Whether kjit's kernels run on tensors of `device` (CUDA GPUs)."""
    return device.type == "cuda"


class KjitChunkedLogProb:
    """What TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, TRL 1.16) calls for each
    forward with fused_lm_head=True, ChunkedLogProbFunction.apply(hidden, weight, bias, targets,
    temperature, chunk_size, final_logit_softcapping, logit_scale, outputs), answered by
    kjit.torch.linear_log_probs: the log-probabilities and entropies of hidden @ weight.T + bias
    divided by the temperature, in kjit's kernels, with their gradients. TRL's own function runs
    (with a KjitWarning once per cause) where kjit does not compute what is asked: a soft-cap, a
    logit scale other than 1, the outputs log_sum_sq_probs, mean_logits or is_top1, tensors not on
    a CUDA GPU. Under autocast the lm_head runs in autocast's dtype, as TRL's does."""

    original = None  # TRL's ChunkedLogProbFunction, set by use_kjit_lm_head
    _said: set = set()

    @classmethod
    def apply(cls, hidden, weight, bias, targets, temperature, chunk_size,
              final_logit_softcapping=None, logit_scale=1.0, outputs=("log_probs",)):
        cannot = cls._cannot(hidden, final_logit_softcapping, logit_scale, outputs)
        if cannot is not None:
            if cannot not in cls._said:
                cls._said.add(cannot)
                warnings.warn(f"kjit.torch.trl: {cannot}: TRL's fused LM head computes the "
                              "log-probabilities", KjitWarning, stacklevel=2)
            return cls.original.apply(hidden, weight, bias, targets, temperature, chunk_size,
                                      final_logit_softcapping, logit_scale, outputs)
        from kjit.torch.rl import linear_log_probs
        device = hidden.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else \
            hidden.dtype
        entropy = "entropy" in outputs
        result = linear_log_probs(hidden.to(dtype), weight.to(dtype), targets,
                                  None if bias is None else bias.to(dtype),
                                  temperature=temperature, entropy=entropy)
        log_probs, ent = result if entropy else (result, None)
        return log_probs, ent, None, None, None

    @staticmethod
    def _cannot(hidden, final_logit_softcapping, logit_scale, outputs):
        if final_logit_softcapping is not None:
            return "a final logit soft-cap"
        if logit_scale != 1.0:
            return f"a logit scale of {logit_scale}"
        others = sorted(set(outputs) - {"log_probs", "entropy"})
        if others:
            return f"the outputs {', '.join(others)}"
        if not _kjit_runs_on(hidden.device):
            return f"tensors on {hidden.device.type}"
        return None


class use_kjit_lm_head:  # noqa: N801 (a context manager, used as a function)
    """Within it, TRL's fused LM head (every trainer that calls model(..., fused_lm_head=True):
    GRPO, RLOO, KTO, SFT's metrics) computes its per-token log-probabilities and entropies with
    kjit (KjitChunkedLogProb). Re-entrant; restores TRL's function on exit."""

    _depth = 0

    def __enter__(self):
        module = _trl_chunked_module()
        if module is None:
            raise RuntimeError("kjit.torch.trl: this TRL has no fused LM head "
                               "(trl.trainer.utils._ChunkedLogProbFunction); TRL 1.16 has")
        if use_kjit_lm_head._depth == 0:
            KjitChunkedLogProb.original = module._ChunkedLogProbFunction
            module._ChunkedLogProbFunction = KjitChunkedLogProb
        use_kjit_lm_head._depth += 1
        return self

    def __exit__(self, *exc):
        use_kjit_lm_head._depth -= 1
        if use_kjit_lm_head._depth == 0:
            _trl_chunked_module()._ChunkedLogProbFunction = KjitChunkedLogProb.original
        return False


class KjitGRPOMixin:
    """Put before GRPOTrainer (or a subclass of it): class T(KjitGRPOMixin, trl.GRPOTrainer).
    The trainer's per-token log-probability and entropy helper (_get_per_token_logps_and_
    entropies: the policy's with gradients, and the old and reference policies' under no_grad,
    which run kjit's forward alone) computes through kjit's RL heads from the hidden states, with
    the trainer's temperature; everything else (generation, rewards, advantages, the loss and its
    masking, logits_to_keep) is TRL's."""

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        with use_kjit_lm_head():
            return super()._get_per_token_logps_and_entropies(*args, **kwargs)


class KjitGRPOTrainer(KjitGRPOMixin, trl.GRPOTrainer):
    """trl.GRPOTrainer whose per-token log-probabilities and entropies are kjit's
    (KjitGRPOMixin)."""
