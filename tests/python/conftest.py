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


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private kernel cache and no tuning database, so a test sees only its own builds."""
    monkeypatch.setenv("KJIT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"
