"""Hugging Face's Trainer with apply_to(metrics=True) and KjitMetricsMixin, a few steps of a tiny
random LLaMA on the CPU: the losses and the trained weights are the unpatched model's, and the
logs carry mean_token_accuracy and entropy equal to what the model's logits give. On the CPU
Hugging Face's loss runs (kjit's kernels need a GPU) and the metrics come from the logits, unless
a test stands kjit's loss in (test_hf_outputs_cpu's stand-in). With a GPU the same runs on it
with kjit's kernels, fp32 (so that the comparison is tight), both ways: the loss over the logits
and the fused lm_head. Skips without torch, transformers and accelerate (which Trainer needs)."""

import copy
import importlib.util
import warnings

import pytest

from conftest import needs_gpu, needs_torch, small_hf_model

pytestmark = [needs_torch, pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "accelerate")),
    reason="transformers or accelerate is not installed")]

try:
    import torch
    import torch.nn.functional as F
    import transformers
    import kjit.torch as kt
    from kjit.torch.integrations import hf
    from kjit.torch.integrations.trainer import KjitMetricsMixin
    from test_hf_outputs_cpu import kjit_loss_on_cpu  # noqa: F401 (a fixture)
except ImportError:
    pass

VOCAB = 97


def logged_callback():
    """A TrainerCallback that keeps every log."""
    class Logged(transformers.TrainerCallback):
        def __init__(self):
            self.logs = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))
    return Logged()


def dataset(n=8, seq=10):
    g = torch.Generator().manual_seed(7)
    rows = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (seq,), generator=g)
        labels = ids.clone()
        labels[:2] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows


def train(model, trainer_class, tmp_path, steps=3, cpu=True, bf16=False):
    logged = logged_callback()
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=2, max_steps=steps,
        logging_steps=1, learning_rate=1e-3, report_to=[], use_cpu=cpu, save_strategy="no",
        bf16=bf16, remove_unused_columns=False, seed=0, data_seed=0, dataloader_num_workers=0)
    trainer = trainer_class(model=model, args=args, train_dataset=dataset(), callbacks=[logged])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kt.KjitFallbackWarning)
        trainer.train()
    return [log for log in logged.logs if "loss" in log], trainer


def kjit_trainer():
    class KjitTrainer(KjitMetricsMixin, transformers.Trainer):
        pass
    return KjitTrainer


def expected_metrics(model, batches):
    """Token-weighted accuracy and entropy of the model's own logits over the batches, and the
    number of tokens."""
    hits = entropy = count = 0.0
    device = next(model.parameters()).device
    with torch.no_grad():
        for batch in batches:
            batch = {k: v.to(device) for k, v in batch.items()}
            logits = model(input_ids=batch["input_ids"]).logits.double()
            target = F.pad(batch["labels"], (0, 1), value=-100)[:, 1:].reshape(-1)
            flat = logits.reshape(-1, VOCAB)
            valid = target != -100
            logp = torch.log_softmax(flat, -1)
            hits += ((flat.argmax(-1) == target) & valid).sum().item()
            entropy += (-(logp.exp() * logp).sum(-1))[valid].sum().item()
            count += valid.sum().item()
    return hits / count, entropy / count, count


def test_the_old_module_paths_give_the_same_names():
    import kjit.torch.hf
    import kjit.torch.trainer
    assert kjit.torch.hf.take_metrics is hf.take_metrics
    assert kjit.torch.hf.apply_to is kt.apply_to
    assert kjit.torch.trainer.KjitMetricsMixin is KjitMetricsMixin


@pytest.mark.parametrize("kjit_loss", [False, True], ids=["hf_loss", "kjit_loss_stand_in"])
def test_trainer_logs_kjits_metrics_and_trains_as_the_unpatched_model(tmp_path, kjit_loss,
                                                                      request):
    if kjit_loss:
        request.getfixturevalue("kjit_loss_on_cpu")
    base = small_hf_model("llama", vocab_size=VOCAB, hidden_size=32, max_positions=64,
                          final_softcap=0.0)
    patched = copy.deepcopy(base)
    start = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, metrics=True)
    expected_logs, _ = train(base, transformers.Trainer, tmp_path / "base")
    logs, trainer = train(patched, kjit_trainer(), tmp_path / "kjit")
    assert len(logs) == len(expected_logs) == 3
    for got, want in zip(logs, expected_logs):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-5)
        assert "mean_token_accuracy" in got and "entropy" in got, got
        assert "mean_token_accuracy" not in want
    for p, q in zip(patched.parameters(), base.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6)
    # The first step's metrics are those of the starting model's logits on its batch.
    first = next(iter(trainer.get_train_dataloader()))
    accuracy, entropy, _ = expected_metrics(start.train(), [first])
    assert logs[0]["mean_token_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert logs[0]["entropy"] == pytest.approx(entropy, rel=1e-5)


@pytest.mark.parametrize("kjit_loss", [False, True], ids=["hf_loss", "kjit_loss_stand_in"])
def test_under_bf16_autocast_the_metrics_are_logged_too(tmp_path, kjit_loss, request):
    """accelerate's mixed-precision forward wrapper returns a new output (converted to fp32)
    without the kjit_metrics attribute; the mixin still gets them."""
    if kjit_loss:
        request.getfixturevalue("kjit_loss_on_cpu")
    model = small_hf_model("llama", vocab_size=VOCAB, hidden_size=32, max_positions=64,
                           final_softcap=0.0)
    kt.apply_to(model, rms_norm=False, metrics=True)
    logs, _ = train(model, kjit_trainer(), tmp_path, bf16=True)
    assert "forward" in vars(model), "accelerate wrapped the forward"
    assert len(logs) == 3
    for log in logs:
        assert 0 <= log["mean_token_accuracy"] <= 1 and log["entropy"] > 0, log


@needs_gpu
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "lm_head_fused"])
def test_trainer_on_the_gpu_with_kjits_kernels(tmp_path, fused):
    base = small_hf_model("llama", vocab_size=VOCAB, hidden_size=32, max_positions=64,
                          final_softcap=0.0).cuda()
    patched = copy.deepcopy(base)
    start = copy.deepcopy(base)
    changed = kt.apply_to(patched, metrics=True, linear_cross_entropy=fused, strict=True)
    assert changed["runs"]["rms_norm"] == "kjit"
    expected_logs, _ = train(base, transformers.Trainer, tmp_path / "base", cpu=False)
    logs, trainer = train(patched, kjit_trainer(), tmp_path / "kjit", cpu=False)
    assert len(logs) == len(expected_logs) == 3
    for got, want in zip(logs, expected_logs):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4)
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=1e-3)
    # Adam's first steps move each weight by about the learning rate whatever its gradient's
    # size: weights agree to a few steps' worth where fp32 rounding tips a tiny gradient's sign.
    for p, q in zip(patched.parameters(), base.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=3e-3)
    first = next(iter(trainer.get_train_dataloader()))
    accuracy, entropy, count = expected_metrics(start.train(), [first])
    # (the fused lm_head's logits come from another GEMM: a near tie may flip)
    assert logs[0]["mean_token_accuracy"] == pytest.approx(accuracy, abs=1 / count + 1e-6)
    assert logs[0]["entropy"] == pytest.approx(entropy, rel=1e-4)
