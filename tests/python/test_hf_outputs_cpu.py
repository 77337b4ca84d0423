"""What a training forward hands out after apply_to (issue 35): never the loss's gradient as its
logits. By default the gradient has a buffer of its own and outputs.logits are the model's;
inplace_backward=True writes the gradient over them and empties outputs.logits; metrics=True puts
kjit_metrics (token accuracy, mean entropy, token count) on the output, from kjit's loss, from
the fused lm_head, or (where Hugging Face's loss runs) from the logits.

kjit's kernels need a GPU, so kjit.torch.cross_entropy is replaced here by a float64 stand-in
that does what the kernel does to the logits: with inplace_backward it writes the gradient over
them during the forward. A default that let the gradient reach outputs.logits fails these tests.
Skips without torch and transformers.
"""

import copy

import pytest

from conftest import needs_transformers, small_hf_model

pytestmark = needs_transformers

try:
    import torch
    import torch.nn.functional as F
    import kjit.torch as kt
    from kjit._loss_options import LossOptions
    from kjit.torch import _common
    from kjit.torch.integrations import hf
except ImportError:
    pass

VOCAB = 97


def _extras(logits, target, ignore_index, loss, names, reduction, weight=None):
    """A LossOutput as kjit's kernels would make it, from float64 logits."""
    with torch.no_grad():
        lse = torch.logsumexp(logits, -1)
        logp = logits - lse[:, None]
        entropy = -(logp.exp() * logp).sum(-1)
        valid = target != ignore_index
        x_t = logits.gather(1, torch.where(valid, target, 0)[:, None])[:, 0]
        return _common.loss_output(names, loss, target, lse.float(),
                                   logits.argmax(-1).to(target.dtype), entropy.float(),
                                   torch.where(valid, x_t - lse, 0.0).float(),
                                   vocab=logits.shape[-1],
                                   options=LossOptions(ignore_index, reduction), weight=weight)


@pytest.fixture
def kjit_loss_on_cpu(monkeypatch):
    """kjit's cross-entropy on CPU tensors, in place as the kernel is; records each call."""
    calls = []

    def cross_entropy(logits, target, weight=None, *, ignore_index=-100, reduction="mean",
                      grad_scale=None, inplace_backward=True, extras=False, **unused):
        calls.append({"inplace_backward": inplace_backward, "extras": extras,
                      "reduction": reduction})
        # (fp32, as kjit's loss and Hugging Face's, which upcasts the logits)
        loss = F.cross_entropy(logits.float(), target, ignore_index=ignore_index,
                               reduction=reduction)
        out = loss
        if extras:
            out = _extras(logits.detach().double(), target, ignore_index, loss,
                          _common.extras_wanted(extras), reduction)
        if inplace_backward and not logits.is_leaf and logits.requires_grad:
            # What the fused kernel does: the gradient, for the declared upstream gradient,
            # written over the logits during the forward (the graph above keeps what it needs).
            scale = 1.0 if grad_scale is None else grad_scale
            (grad,) = torch.autograd.grad(loss * scale, logits, retain_graph=True)
            logits.data.copy_(grad)
        return out

    monkeypatch.setattr(hf, "_not_for_kjit", lambda t: None)  # as if on a GPU
    monkeypatch.setattr(hf, "cross_entropy", cross_entropy)
    return calls


def tiny(kind="llama"):
    return small_hf_model(kind, vocab_size=VOCAB, hidden_size=32, max_positions=64,
                          final_softcap=3.0).to(torch.float64).train()


def inputs(seed=1, batch=2, seq=12):
    ids = torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, :3] = -100
    return ids, labels


def step(model, **kwargs):
    model.zero_grad()
    out = model(**kwargs)
    out.loss.backward() if not isinstance(out, tuple) else out[0].backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def expected_metrics(logits, labels):
    """Accuracy and mean entropy of the unpatched model's logits over the counted tokens."""
    with torch.no_grad():
        target = F.pad(labels, (0, 1), value=-100)[:, 1:].reshape(-1)
        flat = logits.reshape(-1, VOCAB)
        valid = target != -100
        logp = torch.log_softmax(flat, -1)
        entropy = -(logp.exp() * logp).sum(-1)
        hits = (flat.argmax(-1) == target) & valid
        return (hits.sum() / valid.sum()).item(), entropy[valid].mean().item(), valid.sum().item()


@pytest.mark.parametrize("kind", ["llama", "gemma2"])
def test_by_default_a_training_forwards_logits_are_the_models(kind, kjit_loss_on_cpu):
    base = tiny(kind)
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False)
    ids, labels = inputs()
    expected, expected_grads = step(base, input_ids=ids, labels=labels)
    out, grads = step(patched, input_ids=ids, labels=labels)
    assert kjit_loss_on_cpu == [{"inplace_backward": False, "extras": False,
                                 "reduction": "mean"}]
    assert out.logits.shape == (2, 12, VOCAB)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-9)
    assert not hasattr(out, "kjit_metrics")


def test_the_stand_in_writes_the_gradient_over_logits_it_is_allowed_to(kjit_loss_on_cpu):
    # The check above can fail: the stand-in does overwrite logits given in place, as kjit does.
    logits = torch.randn(4, VOCAB, dtype=torch.float64, requires_grad=True)
    view = logits * 1.0
    before = view.detach().clone()
    hf.cross_entropy(view, torch.arange(4), inplace_backward=True)
    assert not torch.equal(view.detach(), before)


@pytest.mark.parametrize("return_dict", [True, False])
def test_inplace_backward_hides_the_overwritten_logits(kjit_loss_on_cpu, return_dict):
    base = tiny()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, inplace_backward=True)
    ids, labels = inputs()
    expected, expected_grads = step(base, input_ids=ids, labels=labels)
    out, grads = step(patched, input_ids=ids, labels=labels, return_dict=return_dict)
    assert kjit_loss_on_cpu[0]["inplace_backward"] is True
    logits = out.logits if return_dict else out[1]
    assert logits.shape == (2, 0, VOCAB), "the gradient went over the logits: none handed out"
    loss = out.loss if return_dict else out[0]
    torch.testing.assert_close(loss, expected.loss, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-5, atol=1e-9)
    # Evaluation and forwards without labels compute and return their logits as before.
    with torch.no_grad():
        assert patched(input_ids=ids).logits.shape == (2, 12, VOCAB)
        patched.eval()
        assert patched(input_ids=ids, labels=labels).logits.shape == (2, 12, VOCAB)


def test_a_forward_replaced_on_the_instance_never_writes_in_place(kjit_loss_on_cpu):
    # Where the class's forward (which hides the logits) does not run, the loss allocates.
    model = tiny()
    with pytest.warns(UserWarning, match="replaced on the instance"):
        model.forward = model.forward  # as accelerate's wrappers do
        kt.apply_to(model, rms_norm=False, inplace_backward=True)
    ids, labels = inputs()
    out = model(input_ids=ids, labels=labels)
    assert kjit_loss_on_cpu[0]["inplace_backward"] is False
    assert out.logits.shape == (2, 12, VOCAB)


@pytest.mark.parametrize("num_items", [None, 31])
def test_metrics_come_with_kjits_loss(kjit_loss_on_cpu, num_items):
    base = tiny()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, metrics=True)
    ids, labels = inputs()
    extra = {} if num_items is None else {"num_items_in_batch": torch.tensor(num_items)}
    expected, _ = step(base, input_ids=ids, labels=labels, **extra)
    out, _ = step(patched, input_ids=ids, labels=labels, **extra)
    assert kjit_loss_on_cpu[0]["extras"] == ("token_accuracy", "mean_entropy", "num_tokens")
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    accuracy, entropy, count = expected_metrics(expected.logits, labels)
    m = out.kjit_metrics
    assert set(m) == {"token_accuracy", "entropy", "num_tokens"}
    assert m["num_tokens"].item() == count == 2 * 11 - 2  # labels[0, 1:3] ignored
    assert m["token_accuracy"].item() == pytest.approx(accuracy, abs=1e-7)
    assert m["entropy"].item() == pytest.approx(entropy, rel=1e-6)
    assert "kjit_metrics" not in out.keys()  # not a model output field: to_tuple() is unchanged


def test_metrics_where_hugging_faces_loss_runs(monkeypatch):
    # On the CPU the original loss runs (a KjitFallbackWarning says so); metrics from the logits.
    base = tiny()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, metrics=True)
    ids, labels = inputs()
    expected, _ = step(base, input_ids=ids, labels=labels)
    with pytest.warns(kt.KjitFallbackWarning):
        out, _ = step(patched, input_ids=ids, labels=labels)
    torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
    torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
    accuracy, entropy, count = expected_metrics(expected.logits, labels)
    m = out.kjit_metrics
    assert m["num_tokens"].item() == count
    assert m["token_accuracy"].item() == pytest.approx(accuracy, abs=1e-7)
    assert m["entropy"].item() == pytest.approx(entropy, rel=1e-5)


@pytest.fixture
def fused_with_metrics_on_cpu(monkeypatch):
    """kjit's fused lm_head + loss on CPU tensors, its extras too, in torch; records each call's
    options."""
    calls = []

    def lce(hidden, weight, target, bias=None, *, ignore_index=-100, reduction="mean",
            softcap=0.0, extras=False, **options):
        calls.append({"reduction": reduction, "extras": extras, **options})
        logits = F.linear(hidden, weight, bias)
        # (fp32, as kjit's loss and Hugging Face's, which upcasts the logits)
        loss = F.cross_entropy(logits.float(), target, ignore_index=ignore_index,
                               reduction=reduction)
        if not extras:
            return loss
        return _extras(logits.detach().double(), target, ignore_index, loss,
                       _common.extras_wanted(extras), reduction)

    monkeypatch.setattr(hf, "_runs_on_kjit", lambda hidden: True)
    monkeypatch.setattr(hf, "linear_cross_entropy", lce)
    return calls


def test_metrics_from_the_fused_lm_head(fused_with_metrics_on_cpu):
    base = tiny()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True,
                metrics=True)
    ids, labels = inputs()
    expected, _ = step(base, input_ids=ids, labels=labels)
    out, _ = step(patched, input_ids=ids, labels=labels)
    assert [c["extras"] for c in fused_with_metrics_on_cpu] == [
        ("token_accuracy", "mean_entropy", "num_tokens")]
    assert out.logits.shape == (2, 0, VOCAB)
    accuracy, entropy, count = expected_metrics(expected.logits, labels)
    assert out.kjit_metrics["num_tokens"].item() == count
    assert out.kjit_metrics["token_accuracy"].item() == pytest.approx(accuracy, abs=1e-7)
    assert out.kjit_metrics["entropy"].item() == pytest.approx(entropy, rel=1e-6)


def test_apply_to_again_takes_the_new_options(kjit_loss_on_cpu):
    model = tiny()
    kt.apply_to(model, rms_norm=False, inplace_backward=True)
    kt.apply_to(model, rms_norm=False, metrics=True)
    ids, labels = inputs()
    out = model(input_ids=ids, labels=labels)
    assert kjit_loss_on_cpu[-1]["inplace_backward"] is False
    assert out.logits.shape == (2, 12, VOCAB) and hasattr(out, "kjit_metrics")
    assert not isinstance(model.loss_function.original, hf._CausalLMLoss)
