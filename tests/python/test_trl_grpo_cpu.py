"""TRL's GRPOTrainer on kjit's RL heads (kjit.torch.integrations.trl.KjitGRPOTrainer), a few steps
of a tiny random LLaMA on the CPU against TRL's own GRPOTrainer: the same logged loss, entropy,
grad_norm and trained weights, with the per-token log-probabilities and entropies (the policy's with
their gradients, the reference policy's forward-only) computed by kjit.torch.linear_log_probs (its
kernels replaced by float64 stand-ins on the CPU, as in test_rl_cpu.py), at temperature 0.7 and with
TRL's entropy bonus (entropy_coef) so that the entropy's gradient reaches the weights; on a GPU also
with kjit's kernels themselves. Skips without torch, transformers, trl and datasets."""

import importlib.util
import warnings

import pytest

from conftest import needs_gpu, needs_torch, small_hf_model

pytestmark = [needs_torch, pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "trl", "datasets")),
    reason="transformers, trl or datasets is not installed")]

try:
    import torch
    import datasets
    import transformers
    import trl
    import kjit
    import kjit.torch as kt
    import kjit.torch.integrations.trl as ktrl
    from test_rl_cpu import launches  # noqa: F401 (the fixture: kernels as float64 stand-ins)
    from test_trl_cpu import VOCAB, tokenizer
except ImportError:
    pass


def reward_length(completions, **kwargs):
    """A reward that differs between completions: their length in characters."""
    return [float(len(c)) for c in completions]


def train(model, trainer_class, tmp_path, steps=2, cpu=True, **config):
    logged = []

    class Logged(transformers.TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logged.append(dict(logs or {}))

    prompts = datasets.Dataset.from_list(
        [{"prompt": " ".join(f"t{3 + (7 * i + 3 * j) % (VOCAB - 3)}" for j in range(4))}
         for i in range(8)])
    args = trl.GRPOConfig(output_dir=str(tmp_path), per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=6, temperature=0.7,
                          max_steps=steps, logging_steps=1, learning_rate=1e-1, optim="sgd",
                          report_to=[], use_cpu=cpu, save_strategy="no", seed=0, data_seed=0,
                          dataloader_num_workers=0, **config)
    trainer = trainer_class(model=model, args=args, reward_funcs=reward_length,
                            train_dataset=prompts, processing_class=tokenizer(),
                            callbacks=[Logged()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kjit.KjitWarning)
        trainer.train()
    return [log for log in logged if "loss" in log], trainer.model


@pytest.fixture
def kjit_on_cpu(launches, monkeypatch):
    """kjit's path taken on the CPU: the stand-in kernels, and CPU tensors let through."""
    monkeypatch.setattr(ktrl, "_kjit_runs_on", lambda device: True)
    return launches


# fp32, and bf16 autocast (GRPOConfig's default: the lm_head in bf16 in both paths, whose bf16
# roundings of the logits and their gradient differ; TRL rounds the hidden states per tile).
@pytest.mark.parametrize("config, tolerance", [
    (dict(beta=0.0, bf16=False), 1e-4),
    (dict(beta=0.0, entropy_coef=0.1, bf16=False), 1e-4),
    (dict(beta=0.04, bf16=False), 1e-4),
    (dict(beta=0.04, entropy_coef=0.1, bf16=True), 2e-2)])
def test_grpo_steps_match_trls_own(kjit_on_cpu, tmp_path, config, tolerance):
    # Saved, so that the trainers load it by path: GRPO loads its reference model (beta > 0) so.
    base = str(tmp_path / "model")
    small_hf_model("llama", vocab_size=VOCAB, hidden_size=32, max_positions=64,
                   final_softcap=0.0).save_pretrained(base)
    ours_logs, ours = train(base, ktrl.KjitGRPOTrainer, tmp_path / "kjit", **config)
    assert kjit_on_cpu, "kjit's RL heads ran"
    assert any(x[0] == "backward_" for x in kjit_on_cpu), "and their backward"
    if config["beta"]:  # the reference policy's forward-only passes (no backward of theirs)
        assert sum(x[0] == "forward" for x in kjit_on_cpu) > sum(
            x[0] == "backward_" for x in kjit_on_cpu)
    theirs_logs, theirs = train(base, trl.GRPOTrainer, tmp_path / "trl", **config)
    assert len(ours_logs) == len(theirs_logs) == 2
    for a, b in zip(ours_logs, theirs_logs):
        for key in ("loss", "grad_norm", "entropy", "reward"):
            assert key in a and key in b, key
            assert a[key] == pytest.approx(b[key], rel=tolerance, abs=tolerance / 10), key
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=tolerance, atol=tolerance / 10, msg=name)


@needs_gpu
def test_on_the_gpu_kjits_kernels_match_trls_own(tmp_path):
    """Two fp32 GRPO steps on the GPU with kjit's RL-head kernels (no stand-ins), a reference
    model and the entropy bonus, against TRL's own trainer (its Triton fused head)."""
    base = str(tmp_path / "model")
    small_hf_model("llama", vocab_size=VOCAB, hidden_size=32, max_positions=64,
                   final_softcap=0.0).save_pretrained(base)
    config = dict(beta=0.04, entropy_coef=0.1, bf16=False, cpu=False)
    ours_logs, ours = train(base, ktrl.KjitGRPOTrainer, tmp_path / "kjit", **config)
    theirs_logs, theirs = train(base, trl.GRPOTrainer, tmp_path / "trl", **config)
    assert len(ours_logs) == len(theirs_logs) == 2
    for a, b in zip(ours_logs, theirs_logs):
        for key in ("loss", "grad_norm", "entropy", "reward"):
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-4), key
    for (name, p), q in zip(ours.named_parameters(), theirs.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=1e-4, msg=name)


def test_the_fused_head_is_trls_again_outside_the_helper(kjit_on_cpu):
    import trl.trainer.utils as utils
    original = utils._ChunkedLogProbFunction
    with ktrl.use_kjit_lm_head():
        with ktrl.use_kjit_lm_head():
            assert utils._ChunkedLogProbFunction is ktrl.KjitChunkedLogProb
        assert utils._ChunkedLogProbFunction is ktrl.KjitChunkedLogProb
    assert utils._ChunkedLogProbFunction is original


def test_what_kjit_does_not_compute_falls_back_to_trl(kjit_on_cpu):
    g = torch.Generator().manual_seed(0)
    h, w = torch.randn(5, 8, generator=g), torch.randn(11, 8, generator=g)
    t = torch.randint(0, 11, (5,), generator=g)
    with ktrl.use_kjit_lm_head():
        kjit_out = ktrl.KjitChunkedLogProb.apply(h, w, None, t, 0.7, 4096, None, 1.0,
                                                 ("log_probs", "entropy"))
        assert len(kjit_on_cpu) == 1
        with pytest.warns(kjit.KjitWarning, match="the outputs is_top1"):
            trl_out = ktrl.KjitChunkedLogProb.apply(h, w, None, t, 0.7, 4096, None, 1.0,
                                                    ("log_probs", "entropy", "is_top1"))
        assert len(kjit_on_cpu) == 1 and trl_out[4] is not None
    torch.testing.assert_close(kjit_out[0], trl_out[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kjit_out[1], trl_out[1], rtol=1e-5, atol=1e-5)
    assert kjit_out[2:] == (None, None, None)
