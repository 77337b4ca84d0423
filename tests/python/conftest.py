"""Shared fixtures of the Python suite. Tests that need torch or a GPU skip visibly (run pytest
with -rs to list why); they never pass without running."""

import importlib.util

import pytest

HAS_TORCH = importlib.util.find_spec("torch") is not None


def cuda_available() -> bool:
    if not HAS_TORCH:
        return False
    import torch
    return torch.cuda.is_available()


needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed")
needs_gpu = pytest.mark.skipif(not cuda_available(), reason="no CUDA GPU (torch.cuda.is_available() "
                               "is False)")
# The Hugging Face tests: torch and transformers.
needs_transformers = [needs_torch,
                      pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                         reason="transformers is not installed")]


def small_hf_model(kind: str, *, vocab_size: int, hidden_size: int, max_positions: int,
                   final_softcap: float):
    """A randomly initialized (seed 0) two-layer Hugging Face causal LM on the CPU: "llama",
    "qwen2", "gemma2" (with its attention and final logit soft-caps), or another model type
    transformers knows ("mixtral", "qwen3_moe": 4 experts, 2 a token), 4 heads, 2 KV heads, eager
    attention."""
    import torch
    import transformers
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size,
                  intermediate_size=2 * hidden_size, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=max_positions)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common)
    elif kind == "gemma2":
        head_dim = hidden_size // 4
        config = transformers.Gemma2Config(**common, head_dim=head_dim,
                                           final_logit_softcapping=final_softcap,
                                           attn_logit_softcapping=50.0,
                                           sliding_window=max_positions // 2,
                                           query_pre_attn_scalar=head_dim)
    else:
        experts = dict(num_local_experts=4, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=hidden_size // 2)
        config = transformers.AutoConfig.for_model(kind, **common, **experts, pad_token_id=0,
                                                   bos_token_id=1, eos_token_id=2)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private kernel cache and no tuning database, so a test sees only its own builds."""
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
