"""Hugging Face Trainer (and its subclasses) logging kjit's metrics; for TRL's SFTTrainer, which
computes its own loss, see kjit.torch.integrations.trl.

    import kjit.torch
    from kjit.torch.integrations.trainer import KjitMetricsMixin

    class KjitTrainer(KjitMetricsMixin, transformers.Trainer):
        pass

    kjit.torch.apply_to(model, metrics=True)          # or with linear_cross_entropy=True
    KjitTrainer(model=model, args=args, train_dataset=data).train()

apply_to(metrics=True) puts outputs.kjit_metrics (token accuracy, mean entropy and the number of
tokens, 0-d device tensors computed with the loss) on every forward with labels; the mixin sums
them over the steps between two logs, weighted by their tokens, on the device, and adds
"mean_token_accuracy" and "entropy" (TRL's names; "eval_..." in evaluation) to each log, reading
them back only then. Everything else is the trainer's own.
"""

from __future__ import annotations

import torch

from kjit.torch.integrations.hf import take_metrics

# outputs.kjit_metrics' keys -> the names the logs get (TRL's).
LOGGED = {"token_accuracy": "mean_token_accuracy", "entropy": "entropy"}


class KjitMetricsMixin:
    """Put before the trainer class: class T(KjitMetricsMixin, transformers.Trainer)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None,
                     **kwargs):
        # (take_metrics, not outputs.kjit_metrics: under mixed precision accelerate's forward
        # wrapper returns a new output, converted to fp32, without the attribute)
        take_metrics()
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True,
                                             num_items_in_batch=num_items_in_batch, **kwargs)
        metrics = take_metrics()
        if metrics is not None:
            self._kjit_add("train" if model.training else "eval", metrics)
        return (loss, outputs) if return_outputs else loss

    def _kjit_add(self, mode: str, metrics: dict) -> None:
        """Adds one step's metrics, weighted by its tokens, to the sums of `mode` (on the device:
        no host synchronization until the log)."""
        n = metrics["num_tokens"].detach().to(torch.float64)
        values = [torch.nan_to_num(metrics[key].detach().to(torch.float64) * n)
                  for key in LOGGED] + [n]
        step = torch.stack(values)
        sums = self.__dict__.setdefault("_kjit_sums", {})
        sums[mode] = step if mode not in sums else sums[mode] + step

    def log(self, logs: dict, *args, **kwargs) -> None:
        evaluation = any(key.startswith("eval_") for key in logs)
        sums = self.__dict__.get("_kjit_sums", {}).pop("eval" if evaluation else "train", None)
        if sums is not None:
            *weighted, n = sums.tolist()
            if n > 0:
                for name, value in zip(LOGGED.values(), weighted):
                    logs[("eval_" if evaluation else "") + name] = value / n
        super().log(logs, *args, **kwargs)
