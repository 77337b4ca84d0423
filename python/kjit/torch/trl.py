"""TRL's SFTTrainer on kjit's loss.

    import kjit.torch
    from kjit.torch.trl import KjitSFTTrainer

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
"""

from __future__ import annotations

import warnings

import torch
import transformers
import trl

from kjit._runtime import KjitWarning
from kjit.torch.hf import take_metrics


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
