"""apply_to on the model families added on 2026-12-06 (Gemma 3's text model, Llama 4's text model,
OLMo 2, 3 and OLMoE, Granite and Granite MoE, DeepSeek V2 and V3, gpt-oss, Ministral, SmolLM3,
GLM-4, Seed-OSS, Arcee, Apertus, EXAONE 4, ERNIE 4.5, Hunyuan dense, Helium, Qwen 2.5 VL and
Qwen 3 VL on text), each a tiny random model of the installed transformers on the CPU, against the
same model unpatched:

- every RMSNorm apply_to swaps computes, in bfloat16, bit for bit what Hugging Face's module does,
  with kjit's rounding (the casting and weight offset its _SUPPORTED entry names) written out in
  torch; the other casting differs, so a wrong entry fails;
- a training step with kjit's norms and loss (their kernels replaced by torch stand-ins on the CPU,
  as in test_hf_outputs_cpu.py) gives the model's loss and gradients;
- the fused lm_head + loss (linear_cross_entropy=True) too, with Gemma 3's soft-cap and Granite's
  logits scaling applied.

Skips without torch and transformers.
"""

import copy

import pytest

from conftest import needs_gpu, needs_transformers
from test_hf_fusion_cpu import fused_on_cpu  # noqa: F401 (a fixture)
from test_hf_outputs_cpu import kjit_loss_on_cpu  # noqa: F401 (a fixture)

pytestmark = needs_transformers

try:
    import torch
    import kjit.torch as kt
    from kjit.torch.integrations import hf
except ImportError:
    pass

VOCAB = 97

# model_type -> the config beyond the common tiny one; (a soft-cap and a logits scaling that is
# not a power of two, so that both are exercised).
FAMILIES = {
    "gemma3_text": dict(head_dim=8, final_logit_softcapping=3.0, sliding_window=8,
                        query_pre_attn_scalar=8),
    "llama4_text": dict(head_dim=8, num_local_experts=4, num_experts_per_tok=1,
                        intermediate_size_mlp=64, use_qk_norm=True, attention_chunk_size=8,
                        interleave_moe_layer_step=1),
    "olmo2": {},
    "olmo3": dict(sliding_window=8),
    "granite": dict(logits_scaling=3.0),
    "deepseek_v3": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=8, head_dim=8, first_k_dense_replace=1, n_group=2,
                        topk_group=1, n_shared_experts=1, num_key_value_heads=4),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, head_dim=8, sliding_window=8),
    "ministral": dict(head_dim=8, sliding_window=8),
    "smollm3": {},
    "granitemoe": dict(num_local_experts=4, num_experts_per_tok=2, logits_scaling=3.0),
    "deepseek_v2": dict(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                        q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
                        v_head_dim=8, head_dim=8, first_k_dense_replace=1, n_group=2,
                        topk_group=1, n_shared_experts=1, num_key_value_heads=4),
    "olmoe": dict(num_experts=4, num_experts_per_tok=2),
    "glm4": dict(head_dim=8),
    "seed_oss": dict(head_dim=8, attention_dropout=0.0, residual_dropout=0.0),  # (0.1 each)
    "arcee": {},
    "apertus": {},
    "exaone4": dict(sliding_window=8),
    "ernie4_5": dict(head_dim=8),
    "hunyuan_v1_dense": dict(head_dim=8),
    "helium": dict(head_dim=8),
    # vision-language: (text config, vision config)
    "qwen2_5_vl": (dict(head_dim=8, rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                          mrope_section=[1, 1, 2])),
                   dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                        out_hidden_size=32, fullatt_block_indexes=[0])),
    "qwen3_vl": (dict(head_dim=8, rope_parameters=dict(rope_type="default", rope_theta=1e4,
                                                        mrope_section=[2, 1, 1])),
                 dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                      out_hidden_size=32, deepstack_visual_indexes=[])),
}
# Their experts' grouped GEMMs take float32 at most.
FLOAT32 = ("deepseek_v2", "deepseek_v3", "gpt_oss", "granitemoe", "olmoe")


def family_model(kind, dtype=None):
    """A randomly initialized (seed 0) two-layer model of the family, eager attention (a
    vision-language one with a one-block vision tower, run on text here)."""
    import transformers
    text = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if isinstance(FAMILIES[kind], tuple):
        text_extra, vision = FAMILIES[kind]
        config = transformers.AutoConfig.for_model(kind, text_config={**text, **text_extra},
                                                   vision_config=vision)
        auto = transformers.AutoModelForImageTextToText
    else:
        config = transformers.AutoConfig.for_model(kind, **{**text, **FAMILIES[kind]})
        auto = transformers.AutoModelForCausalLM
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = auto.from_config(config)
    if dtype is None:
        dtype = torch.float32 if kind in FLOAT32 else torch.float64
    return model.to(dtype)


def kjit_rms_norm(x, weight, eps=1e-6, *, casting="llama", offset=0.0, residual=None):
    """What kjit's rms_norm rounds where (functional.rms_norm's docstring), in torch: the sum of
    squares and rsqrt in fp32; "llama" rounds the normalized x to x's dtype and multiplies by
    offset + weight in it; "gemma" multiplies by offset + weight in fp32 and rounds once. (float64
    x, which kjit's kernels do not take, goes through fp32 as Hugging Face's norms take it.)"""
    assert residual is None
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    if casting == "llama":
        return normed.to(x.dtype) * (offset + weight)
    assert casting == "gemma", casting
    return (normed * (offset + weight.float())).to(x.dtype)


@pytest.fixture
def norms_on_cpu(monkeypatch):
    """kjit's rms_norm on CPU tensors (kjit_rms_norm), as if they were on a GPU; records each
    call's (casting, offset)."""
    calls = []

    def rms_norm(x, weight, eps=1e-6, *, casting="llama", offset=0.0, residual=None):
        calls.append((casting, offset))
        return kjit_rms_norm(x, weight, eps, casting=casting, offset=offset, residual=residual)

    monkeypatch.setattr(hf, "_not_for_kjit", lambda t: None)
    monkeypatch.setattr(hf, "rms_norm", rms_norm)
    return calls


def hf_norms(model):
    return {name: m for name, m in model.named_modules() if type(m).__name__.endswith("RMSNorm")}


def test_every_family_is_supported():
    assert set(FAMILIES) <= set(hf._SUPPORTED)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_each_swapped_norm_rounds_as_hugging_faces_in_bfloat16(kind, norms_on_cpu):
    base = family_model(kind, torch.bfloat16)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for module in hf_norms(base).values():
            if getattr(module, "weight", None) is not None:  # (Gemma's start at 0, others at 1)
                module.weight.copy_(torch.randn(module.weight.shape, generator=g) * 0.5 + 0.3)
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched, cross_entropy=False)
    left_alone = {n for n, m in hf_norms(base).items() if type(m).__name__ in
                  hf._NORMS_LEFT_ALONE}
    assert set(changed["rms_norm"]) == set(hf_norms(base)) - left_alone
    # Llama 4's weightless QK norm, left alone: an RMSNorm class in transformers 5.25, an L2 norm
    # (no RMSNorm in its name, so not listed here) in 5.17.
    assert left_alone == {n for n in hf_norms(base) if n.endswith(".self_attn.qk_norm")}
    assert all(kind == "llama4_text" for _ in left_alone)
    casting, offset = hf._SUPPORTED[kind]
    other = "gemma" if casting == "llama" else "llama"
    differs = 0
    for name in changed["rms_norm"]:
        original, swapped = base.get_submodule(name), patched.get_submodule(name)
        assert isinstance(swapped, kt.KjitHFRMSNorm) and swapped.weight is swapped.original.weight
        assert torch.equal(swapped.weight, original.weight)
        x = (torch.randn(3, 7, original.weight.shape[0], generator=g) * 2).to(torch.bfloat16)
        with torch.no_grad():
            expected, got = original(x), swapped(x)
            wrong = kjit_rms_norm(x, original.weight, swapped.eps, casting=other, offset=offset)
        assert got.dtype == expected.dtype == torch.bfloat16
        assert torch.equal(got, expected), f"{name}: {(got != expected).sum()} elements differ"
        differs += not torch.equal(wrong, expected)
    assert norms_on_cpu and set(norms_on_cpu) == {(casting, offset)}
    assert differs == len(changed["rms_norm"]), f"casting {other!r} should differ from {kind}'s"


def step(model, **inputs):
    model.zero_grad()
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def batch(seed=1):
    ids = torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, :3] = -100
    return {"input_ids": ids, "labels": labels}


def assert_same_step(got, want):
    """Loss and every gradient; the norms round through fp32 (as Hugging Face's do, some of them
    in another order in a float64 model), so the tolerances are fp32's."""
    (out, grads), (expected, expected_grads) = got, want
    torch.testing.assert_close(out.loss, expected.loss, rtol=1e-6, atol=0)
    assert grads.keys() == expected_grads.keys()
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize("num_items", [None, 21])
@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_a_training_step_with_kjits_norms_and_loss_is_the_models(kind, num_items, norms_on_cpu,
                                                                 kjit_loss_on_cpu):
    base = family_model(kind).train()
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched)
    assert changed["loss"].endswith("-> kjit") and changed["runs"]["rms_norm"] == "kjit"
    inputs = batch()
    if num_items is not None:
        inputs["num_items_in_batch"] = torch.tensor(num_items)
    want = step(base, **inputs)
    got = step(patched, **inputs)
    assert len(kjit_loss_on_cpu) == 1
    text_norms = [n for n in changed["rms_norm"] if not n.startswith("model.visual.")]
    assert len(norms_on_cpu) == len(text_norms), "each swapped norm of the text model ran once"
    assert got[0].logits.shape == (2, 12, VOCAB)
    torch.testing.assert_close(got[0].logits, want[0].logits, rtol=1e-5, atol=1e-7)
    assert_same_step(got, want)


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_the_fused_lm_head_and_loss_is_the_models(kind, fused_on_cpu):
    base = family_model(kind).train()
    patched = copy.deepcopy(base)
    kt.apply_to(patched, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    inputs = batch(2)
    want = step(base, **inputs)
    got = step(patched, **inputs)
    assert len(fused_on_cpu) == 1
    call = fused_on_cpu[0]
    assert got[0].logits.shape == (2, 0, VOCAB), "a fused forward computes no logits"
    assert call["softcap"] == (3.0 if kind == "gemma3_text" else 0.0)
    assert call["weight"] is patched.lm_head.weight
    with torch.no_grad():
        final = base.model(input_ids=inputs["input_ids"]).last_hidden_state.reshape(-1, 32)
    divisor = 3.0 if kind in ("granite", "granitemoe") else 1.0
    torch.testing.assert_close(call["hidden"], final / divisor, rtol=1e-12, atol=0)
    assert_same_step(got, want)


# On a GPU, kjit's own kernels: both RMSNorm castings (Gemma 3's offset), a soft-cap (Gemma 3), a
# logits scaling (Granite), norms after the blocks (OLMo 2), experts (gpt-oss).
GPU_FAMILIES = ["gemma3_text", "granite", "olmo2", "smollm3", "glm4", "helium", "gpt_oss"]


@needs_gpu
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "lm_head_fused"])
@pytest.mark.parametrize("kind", GPU_FAMILIES)
def test_on_the_gpu_kjits_kernels_give_the_models_step(kind, fused):
    """fp32, so that the tolerances are fp32's: the loss and every gradient of a training step
    with kjit's RMSNorm and loss (or fused lm_head + loss) kernels against the unpatched model."""
    base = family_model(kind, torch.float32).cuda().train()
    patched = copy.deepcopy(base)
    changed = kt.apply_to(patched, linear_cross_entropy=fused, strict=True)
    assert changed["runs"]["rms_norm"] == "kjit" and changed["linear_cross_entropy"] is fused
    inputs = {k: v.cuda() for k, v in batch(3).items()}
    want = step(base, **inputs)
    got = step(patched, **inputs)
    assert got[0].logits.shape == (2, 0 if fused else 12, VOCAB)
    torch.testing.assert_close(got[0].loss, want[0].loss, rtol=1e-5, atol=0)
    assert got[1].keys() == want[1].keys()
    for name, grad in got[1].items():
        torch.testing.assert_close(grad, want[1][name], rtol=1e-3, atol=1e-6, msg=name)


def test_granites_scaling_is_exact_for_a_power_of_two_in_bfloat16(fused_on_cpu):
    """Dividing the hidden states instead of the logits by 16 (a power of two) changes no bit of
    what lm_head computes."""
    model = family_model("granite", torch.bfloat16).train()
    model.config.logits_scaling = 16.0
    kt.apply_to(model, rms_norm=False, cross_entropy=False, linear_cross_entropy=True)
    inputs = batch(4)
    model(**inputs)
    call = fused_on_cpu[0]
    with torch.no_grad():
        hidden = model.model(input_ids=inputs["input_ids"]).last_hidden_state.reshape(-1, 32)
        expected = model.lm_head(hidden) / 16.0
        got = model.lm_head(call["hidden"].detach())
    assert torch.equal(got, expected)
