"""apply_to(model, linear_cross_entropy=True)'s plumbing on the CPU, with real Hugging Face models:
which forwards fuse, the hidden states the loss gets, the shifted targets, num_items_in_batch,
Gemma 2's soft-cap, copies and PEFT-style direct forward calls. kjit's kernels need a GPU, so the
fused op is replaced here by its float64 definition (the GPU suite checks the op itself and the
fused models on the GPU); everything else is the code users run. Also apply_to's loud fallbacks
(issue 33): a call kjit cannot take (CPU tensors, float64, a float16 forward of the fused lm_head)
runs Hugging Face's code with one KjitFallbackWarning per model and cause, strict=True raises, and
"runs" says what will run. Skips without torch and transformers.
"""

import copy
import inspect
import types
import warnings

import pytest

from conftest import needs_transformers, small_hf_model
from test_torch_autograd_cpu import launches  # noqa: F401 (a fixture)

pytestmark = needs_transformers

try:
    import torch
    import torch.nn.functional as F
    import kjit.torch as kt
    from kjit.torch.integrations import hf
except ImportError:
    pass


def reference_lce(hidden, weight, target, bias=None, *, ignore_index=-100, reduction="mean",
                  softcap=0.0, **unused):
    """kjit.torch.linear_cross_entropy's definition, differentiable: the logits (soft-capped) in
    the inputs' dtype, the loss from them in fp32, as the model's own loss computes it."""
    logits = F.linear(hidden, weight, bias)
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits.float(), target, ignore_index=ignore_index, reduction=reduction)


@pytest.fixture
def fused_on_cpu(monkeypatch):
    """Fusion on CPU tensors, with the reference in place of kjit's kernels; counts its calls."""
    calls = []

    def lce(hidden, weight, target, bias=None, **options):
        calls.append({"hidden": hidden, "weight": weight, "target": target, **options})
        return reference_lce(hidden, weight, target, bias, **options)

    monkeypatch.setattr(hf, "_runs_on_kjit", lambda hidden: True)
    monkeypatch.setattr(hf, "linear_cross_entropy", lce)
    return calls


def tiny_model(kind):
    # float64, so that the comparisons are tight; MoE experts' grouped GEMMs take fp32 at most.
    dtype = torch.float32 if kind.endswith(("moe", "mixtral")) else torch.float64
    return small_hf_model(kind, vocab_size=97, hidden_size=32, max_positions=64,
                          final_softcap=3.0).to(dtype)


def loss_and_grads(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def labels_with_ignored(ids):
    labels = ids.clone()
    labels[0, :3] = -100
    return labels


@pytest.mark.parametrize("kind", ["llama", "qwen2", "gemma2", "mixtral", "qwen3_moe", "phi3"])
def test_a_training_forward_with_labels_fuses_and_matches_the_model(kind, fused_on_cpu):
    base = tiny_model(kind)
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    assert changed["linear_cross_entropy"] is True
    assert changed["loss"].endswith("-> kjit (lm_head fused)")
    # Same class name, so save_pretrained writes the same architecture; still the model's class,
    # and the same forward signature (Trainer keeps the dataset columns it names).
    assert type(patched).__name__ == type(base).__name__
    assert isinstance(patched, type(base))
    assert inspect.signature(patched.forward) == inspect.signature(base.forward)
    assert patched.state_dict().keys() == base.state_dict().keys()
    base.train()
    patched.train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (2, 12), generator=g)
    labels = labels_with_ignored(ids)
    expected, expected_grads = loss_and_grads(base, input_ids=ids, labels=labels)
    out, grads = loss_and_grads(patched, input_ids=ids, labels=labels)

    assert len(fused_on_cpu) == 1
    call = fused_on_cpu[0]
    assert call["hidden"].shape == (2 * 12, 32)  # every position, flattened
    assert call["weight"] is patched.lm_head.weight
    assert torch.equal(call["target"], torch.cat([labels[:, 1:], torch.full((2, 1), -100)],
                                                 dim=1).reshape(-1))
    assert call["softcap"] == (3.0 if kind == "gemma2" else 0.0)
    assert out.logits.shape == (2, 0, 97), "a fused forward computes no logits"
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-9, atol=0)


def test_evaluation_and_forwards_without_labels_compute_the_logits(fused_on_cpu):
    base = tiny_model("llama")
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(2))
    for training, labels in ((False, ids), (True, None)):
        base.train(training)
        patched.train(training)
        with torch.no_grad():
            out, expected = patched(input_ids=ids, labels=labels), base(input_ids=ids, labels=labels)
        assert out.logits.shape == (2, 9, 97)
        torch.testing.assert_close(out.logits, expected.logits, rtol=0, atol=0)
        if labels is not None:
            torch.testing.assert_close(out.loss, expected.loss, rtol=0, atol=0)
    # With logits_to_keep (generation's) the model keeps its own behaviour, here its error.
    base.train()
    patched.train()
    with pytest.raises(ValueError, match="batch_size"):
        base(input_ids=ids, labels=ids, logits_to_keep=1)
    with pytest.raises(ValueError, match="batch_size"):
        patched(input_ids=ids, labels=ids, logits_to_keep=1)
    assert not fused_on_cpu


def test_num_items_in_batch_sums_and_divides_as_the_model_does(fused_on_cpu):
    base = tiny_model("qwen2")
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    base.train()
    patched.train()
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(3))
    labels = labels_with_ignored(ids)
    n = torch.tensor(31)  # tokens over all micro-batches, as Trainer counts them
    expected, expected_grads = loss_and_grads(base, input_ids=ids, labels=labels,
                                              num_items_in_batch=n)
    out, grads = loss_and_grads(patched, input_ids=ids, labels=labels, num_items_in_batch=n)
    assert fused_on_cpu[0]["reduction"] == "sum"
    # The gradients are computed for the upstream gradient the division sends back.
    assert fused_on_cpu[0]["grad_scale"].item() == pytest.approx(1 / 31)
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-9, atol=0)


def test_copies_and_direct_forward_calls_fuse_on_their_own(fused_on_cpu):
    model = tiny_model("llama")
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(2)  # the copy's own weight, not the original's
    model.train()
    twin.train()
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(4))
    twin(input_ids=ids, labels=ids)
    assert fused_on_cpu[-1]["weight"] is twin.lm_head.weight
    # PEFT calls model.forward directly, past nn.Module.__call__.
    model.forward(input_ids=ids, labels=ids)
    assert fused_on_cpu[-1]["weight"] is model.lm_head.weight
    assert len(fused_on_cpu) == 2
    # Applying again changes nothing more.
    assert kt.apply_to(model, rms_norm=False, cross_entropy=False,
                       linear_cross_entropy=True)["linear_cross_entropy"] is True
    model(input_ids=ids, labels=ids)
    assert len(fused_on_cpu) == 3


def test_under_autocast_the_fused_op_runs_in_autocasts_dtype(fused_on_cpu):
    base = tiny_model("llama").float()  # fp32 master weights
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    base.train()
    patched.train()
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(8))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected, expected_grads = loss_and_grads(base, input_ids=ids, labels=ids)
        out, grads = loss_and_grads(patched, input_ids=ids, labels=ids)
    call = fused_on_cpu[0]
    assert call["hidden"].dtype == call["weight"].dtype == torch.bfloat16, "as lm_head would"
    assert patched.lm_head.weight.grad.dtype == torch.float32  # through the cast
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=0, msg=name)


def test_another_models_forward_inside_keeps_its_logits_and_the_loss_stays_ours(fused_on_cpu):
    """A teacher called from a hook inside the student's forward (distillation): only the
    student's own lm_head is fused."""
    base = tiny_model("llama")
    student = copy.deepcopy(base)
    teacher = copy.deepcopy(base)
    with torch.no_grad():
        teacher.lm_head.weight.mul_(3)
    for m in (student, teacher):
        kt.apply_to(m, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    ids = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(9))
    teacher_logits = []

    def call_teacher(module, args, out):
        with torch.no_grad():
            teacher_logits.append(teacher(input_ids=ids).logits)

    for m in (base, student):
        m.model.layers[0].register_forward_hook(call_teacher)
    base.train()
    student.train()
    teacher.eval()
    expected, expected_grads = loss_and_grads(base, input_ids=ids, labels=ids)
    out, grads = loss_and_grads(student, input_ids=ids, labels=ids)
    assert [tuple(t.shape) for t in teacher_logits] == [(2, 12, 97)] * 2
    assert fused_on_cpu[0]["weight"] is student.lm_head.weight
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    assert teacher.lm_head.weight.grad is None
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-9, atol=0, msg=name)


def test_a_peft_style_wrapper_patches_the_model_underneath(fused_on_cpu):
    class Wrapper(torch.nn.Module):  # PEFT's PeftModel, reduced to what apply_to meets
        def __init__(self, model):
            super().__init__()
            self.inner = model

        def get_base_model(self):
            return self.inner

        def forward(self, **kwargs):
            return self.inner.forward(**kwargs)  # as PEFT: past nn.Module.__call__

    wrapped = Wrapper(tiny_model("llama"))
    changed = kt.apply_to(wrapped, rms_norm=False, linear_cross_entropy=True)
    assert changed["linear_cross_entropy"] is True
    assert isinstance(wrapped.inner.loss_function, hf._CausalLMLoss)
    wrapped.train()
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(10))
    assert wrapped(input_ids=ids, labels=ids).logits.shape == (2, 0, 97)
    assert len(fused_on_cpu) == 1


def test_the_soft_cap_is_gemma_2s_alone_and_fp16_is_left_to_the_model(fused_on_cpu):
    model = tiny_model("llama")
    model.config.final_logit_softcapping = 30.0  # a key LLaMA's forward never reads
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    model.train()
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(11))
    model(input_ids=ids, labels=ids)
    assert fused_on_cpu[-1]["softcap"] == 0.0
    # fp16: the forward's gradients for 1/n would reach fp16's subnormals before a loss scaler's
    # factor arrives; the model computes its logits and loss itself.
    with torch.autocast("cpu", dtype=torch.float16):
        out = model(input_ids=ids, labels=ids)
    assert out.logits.shape == (2, 8, 97)
    assert len(fused_on_cpu) == 1


@pytest.mark.parametrize("softcap", [-3.0, 0.0, float("nan")])
def test_a_soft_cap_kjit_does_not_take_leaves_gemma_2s_logits_to_its_forward(softcap,
                                                                           fused_on_cpu):
    """Issue 45, defect 9: Gemma 2's forward soft-caps by whatever final_logit_softcapping says
    (a negative one computes as its absolute value); the fused path raised for it. It now
    computes the logits unfused, as Hugging Face does, and says so (strict: raises)."""
    base = small_hf_model("gemma2", vocab_size=97, hidden_size=32, max_positions=64,
                          final_softcap=softcap).double()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    base.train()
    patched.train()
    out, said = fallback_warnings(lambda: patched(**batch()))
    assert fused_on_cpu == [], "the fused op ran"
    assert out.logits.shape == (2, 8, 97), "lm_head computed the logits"
    assert len(said) == 1 and "lm_head computes the logits, unfused" in said[0], said
    assert f"final_logit_softcapping is {softcap}" in said[0], said
    torch.testing.assert_close(out.loss, base(**batch()).loss, rtol=0, atol=0, equal_nan=True)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True,
                strict=True)
    with pytest.raises(kt.KjitFallbackError, match="final_logit_softcapping"):
        patched(**batch())


def test_pickling_gives_the_unfused_model(fused_on_cpu):
    import pickle
    model = tiny_model("llama")
    kt.apply_to(model, linear_cross_entropy=True)  # norms and loss swapped too
    loaded = pickle.loads(pickle.dumps(model))  # as torch.save(model) and torch.load do
    assert type(loaded) is type(model).__mro__[1], "the model's own class, found by name"
    for (name, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name
    loaded.train()
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(7))
    assert loaded(input_ids=ids, labels=ids).logits.shape == (1, 8, 97)
    assert not fused_on_cpu, "the loaded model is not fused"
    assert sum(isinstance(m, kt.KjitHFRMSNorm) for m in loaded.modules()) == 5, "norms still are"
    assert type(copy.deepcopy(model)) is type(model), "a copy still is"


def test_a_forward_that_raises_leaves_nothing_armed(fused_on_cpu, monkeypatch):
    model = tiny_model("llama")
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    model.train()
    ids = torch.randint(0, 97, (1, 8), generator=torch.Generator().manual_seed(5))

    def broken(*args, **kwargs):
        raise RuntimeError("decoder failed")

    monkeypatch.setattr(model.model, "forward", broken)
    with pytest.raises(RuntimeError, match="decoder failed"):
        model(input_ids=ids, labels=ids)
    monkeypatch.undo()
    assert not getattr(hf._fusion, "armed", False) and hf._fusion.kept is None
    # An unpatched lm_head call afterwards (another model sharing the thread) computes logits.
    hidden = torch.randn(1, 3, 32, dtype=torch.float64)
    assert model.lm_head(hidden).shape == (1, 3, 97)


def test_lm_head_must_be_a_plain_linear():
    model = tiny_model("llama")

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x):
            return self.inner(x)

    model.lm_head = Wrapped(model.lm_head)
    with pytest.raises(ValueError, match="plain nn.Linear, got Wrapped"):
        kt.apply_to(model, linear_cross_entropy=True)
    assert not any(isinstance(m, kt.KjitHFRMSNorm) for m in model.modules()), "nothing changed"


def test_save_pretrained_writes_the_original_architecture(tmp_path):
    import json
    import transformers
    model = tiny_model("llama")
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert type(loaded) is transformers.LlamaForCausalLM
    for (name, p), q in zip(model.named_parameters(), loaded.parameters()):
        assert torch.equal(p, q), name


def test_num_items_in_batch_needs_no_rescale_in_the_backward(launches, monkeypatch):
    """Through kjit.torch.linear_cross_entropy itself (its kernels replaced as in
    test_torch_autograd_cpu.py): the gradients are computed for 1 / num_items_in_batch, the
    upstream gradient the division sends back, so the backward's rescale changes nothing."""
    monkeypatch.setattr(hf, "_runs_on_kjit", lambda hidden: True)
    base = tiny_model("llama").float()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    base.train()
    patched.train()
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(6))
    n = torch.tensor(31)
    expected, expected_grads = loss_and_grads(base, input_ids=ids, labels=ids,
                                              num_items_in_batch=n)
    out, grads = loss_and_grads(patched, input_ids=ids, labels=ids, num_items_in_batch=n)
    assert launches[0] == ("forward_backward", True, True, False, True)  # told the scale
    assert launches[1:] == [("rescale", "d_hidden", False), ("rescale", "d_weight", False)]
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-5, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-7)


# ---- loud fallbacks ----------------------------------------------------------------------------


def batch(seed=0):
    ids = torch.randint(0, 97, (2, 8), generator=torch.Generator().manual_seed(seed))
    return {"input_ids": ids, "labels": ids}


def fallback_warnings(run):
    """The KjitFallbackWarning messages `run()` gives, every one (no filter hides repeats)."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        result = run()
    return result, [str(w.message) for w in seen if issubclass(w.category, kt.KjitFallbackWarning)]


def test_a_model_on_the_cpu_runs_hugging_faces_code_and_says_so_once():
    base = tiny_model("llama")
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched)
    assert changed["loss"] == "ForCausalLMLoss -> kjit"
    assert changed["runs"]["rms_norm"].startswith("Hugging Face's code: its tensors are on cpu")
    assert changed["runs"]["loss"].startswith("Hugging Face's ForCausalLMLoss: its tensors are on "
                                              "cpu")
    out, said = fallback_warnings(lambda: patched(**batch()))
    assert len(said) == 1, said  # one cause, however many norms and the loss meet it
    assert "LlamaForCausalLM" in said[0] and "on cpu, not on a CUDA GPU" in said[0], said
    assert "model.cuda()" in said[0], said
    torch.testing.assert_close(out.loss, base(**batch()).loss, rtol=0, atol=0)
    _, again = fallback_warnings(lambda: patched(**batch(1)))
    assert again == [], "said once per model"
    other = tiny_model("llama")
    kt.apply_to(other)
    _, said_for_other = fallback_warnings(lambda: other(**batch()))
    assert len(said_for_other) == 1, "another model says it too"


def test_strict_raises_instead_of_running_hugging_faces_code():
    model = tiny_model("llama")
    kt.apply_to(model, strict=True)
    with pytest.raises(kt.KjitFallbackError, match=r"strict=True.*RMSNorm.*on cpu"):
        model(**batch())
    kt.apply_to(model, strict=False)  # again, relaxed: the modules patched first follow
    _, said = fallback_warnings(lambda: model(**batch()))
    assert len(said) == 1, said


def test_the_loss_alone_falls_back_loudly_too():
    model = tiny_model("llama")
    changed = kt.apply_to(model, rms_norm=False)
    assert "rms_norm" not in changed["runs"]
    _, said = fallback_warnings(lambda: model(**batch()))
    assert len(said) == 1 and "the loss runs Hugging Face's ForCausalLMLoss" in said[0], said


def test_a_float16_forward_of_the_fused_lm_head_says_it_is_unfused(fused_on_cpu):
    model = tiny_model("llama")
    changed = kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    assert changed["runs"]["loss"].startswith("kjit's fused lm_head + cross-entropy")
    model.train()
    with torch.autocast("cpu", dtype=torch.float16):
        out, said = fallback_warnings(lambda: model(**batch()))
    assert out.logits.shape == (2, 8, 97), "lm_head computed the logits"
    assert len(said) == 1 and "lm_head computes the logits, unfused" in said[0], said
    assert "float16" in said[0] and "bfloat16" in said[0], said
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True, strict=True)
    with torch.autocast("cpu", dtype=torch.float16), pytest.raises(kt.KjitFallbackError,
                                                                   match="float16"):
        model(**batch())


def test_the_norms_fallback_reads_the_parameters_that_replaced_the_originals():
    """Issue 45, defect 14: after apply_to, load_state_dict(assign=True) and to() / half() with
    torch's overwrite-on-conversion replace the norms' Parameters; the fallback ran the original
    module, which kept the old ones (outputs 0.79 off on a tiny LLaMA). Compared with the model
    unpatched, given the same state."""
    base = tiny_model("llama")
    patched = copy.deepcopy(base)
    kt.apply_to(patched)
    g = torch.Generator().manual_seed(4)
    state = {k: v + 0.5 * torch.randn(v.shape, generator=g, dtype=v.dtype)
             for k, v in base.state_dict().items()}
    base.load_state_dict(state)
    patched.load_state_dict(state, assign=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", kt.KjitFallbackWarning)
        torch.testing.assert_close(patched(**batch()).loss, base(**batch()).loss, rtol=0, atol=0)
        overwrite = torch.__future__.get_overwrite_module_params_on_conversion()
        torch.__future__.set_overwrite_module_params_on_conversion(True)
        try:
            for convert in (lambda m: m.to(torch.float32), lambda m: m.half()):
                base, patched = convert(base), convert(patched)
                torch.testing.assert_close(patched(**batch()).loss, base(**batch()).loss,
                                           rtol=0, atol=0)
        finally:
            torch.__future__.set_overwrite_module_params_on_conversion(overwrite)


def test_torch_compile_fullgraph_traces_a_fallback_and_still_says_it():
    """Issue 45, defect 15: torch.compile(fullgraph=True) of a patched model on a fallback path
    broke on the fallback's warnings.warn. The warning is now given while the call is traced,
    once per model and cause as in eager."""
    base = tiny_model("llama")
    patched = copy.deepcopy(base)
    kt.apply_to(patched)
    compiled = torch.compile(patched, fullgraph=True, backend="eager")
    out, said = fallback_warnings(lambda: compiled(**batch()))
    assert len(said) == 1 and "on cpu, not on a CUDA GPU" in said[0], said
    torch.testing.assert_close(out.loss, base(**batch()).loss, rtol=1e-12, atol=0)
    _, again = fallback_warnings(lambda: compiled(**batch(1)))
    assert again == [], "said once per model"


def test_runs_says_a_float16_model_is_not_fused(monkeypatch):
    model = tiny_model("llama").half()
    monkeypatch.setattr(hf, "_not_for_kjit", lambda t: None)  # as if on a GPU
    changed = kt.apply_to(model, rms_norm=False, linear_cross_entropy=True)
    assert changed["runs"]["loss"].startswith(
        "kjit's cross-entropy over the logits (lm_head unfused: a float16 training forward is not "
        "fused"), changed["runs"]


def test_a_dtype_the_kernels_do_not_take_is_a_cause_of_its_own():
    gpu_tensor = types.SimpleNamespace(is_cuda=True, dtype=torch.float64)
    reason, why = hf._not_for_kjit(gpu_tensor)
    assert reason == "dtype torch.float64"
    assert "float32, float16 and bfloat16" in why
    assert hf._not_for_kjit(types.SimpleNamespace(is_cuda=True, dtype=torch.bfloat16)) is None
