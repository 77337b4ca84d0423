"""kjit: JIT-specialized fused kernels for LLM fine-tuning (cross-entropy over large vocabularies,
lm_head + cross-entropy fused, RMSNorm), compiled at run time with NVRTC for the GPU at hand and
cached on disk.

    import kjit
    kjit.Runtime().cross_entropy(vocab=128256).build()   # compile (or load) the kernels
    import kjit.torch                                      # the PyTorch ops (needs torch)
    kjit.torch.apply_to(model)

The package needs only the CUDA driver and NVRTC at run time (pip's nvidia-cuda-nvrtc is found
when the system has none); `python -m kjit doctor` says what is missing.
"""

from kjit import _capi
from kjit._capi import ABI_VERSION, KjitError, KjitInvalidArgument, KjitUnavailable
from kjit._runtime import (CrossEntropy, KjitWarning, LinearCrossEntropy, LogProbs, Op, RmsNorm,
                           Runtime, ShardedCrossEntropy, combine_stats, index, op_schema, tensor,
                           vector)

__all__ = ["ABI_VERSION", "CrossEntropy", "KjitError", "KjitInvalidArgument", "KjitUnavailable",
           "KjitWarning", "LinearCrossEntropy", "LogProbs", "Op", "RmsNorm", "Runtime",
           "ShardedCrossEntropy", "abi_version", "combine_stats", "full_version", "index",
           "op_schema", "tensor", "vector", "version"]


def version() -> str:
    """The native library's version, "0.1.0"."""
    return _capi.lib().kjit_version().decode()


def full_version() -> str:
    """"kjit 0.1.0 (NVRTC 13.0, CUDA driver 13.0)", or "none (why)" for what is missing."""
    return _capi.call_string("kjit_full_version")


def abi_version() -> int:
    return _capi.lib().kjit_abi_version()


__version__ = "0.1.0"
