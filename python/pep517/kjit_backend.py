"""kjit's PEP 517 build backend: scikit-build-core's, asking in addition for pip's CUDA header
packages when no CUDA toolkit has the headers the build reads (pyproject.toml names this module).

kjit reads only headers of CUDA (libcuda, libnvrtc and libcublasLt are opened at run time):
cuda.h, nvrtc.h, cublasLt.h with what they include, and NVTX's (nccl.h is optional: kjit
declares what it calls of NCCL itself, and checks the declarations against nccl.h where it is). cmake/CudaHeaders.cmake takes them from a
toolkit when there is one, else from these packages in the building Python; asking for them only
when needed spares a build on a machine with the toolkit the download (nvidia-cublas alone is
about 440 MB; a torch environment has it already, and pip's cache keeps it).
"""

import os
import shutil

from scikit_build_core import build as _backend
from scikit_build_core.build import *  # noqa: F401,F403 (the hooks this module does not change)

CUDA_HEADER_PACKAGES = [
    "nvidia-cuda-runtime>=13,<14",  # cuda.h, cuda_runtime_api.h, cuda_fp16.h, ...
    "nvidia-cuda-crt>=13,<14",      # crt/host_defines.h
    "nvidia-cuda-cccl>=13,<14",     # nv/target (cuda_fp16.h includes it)
    "nvidia-cuda-nvrtc>=13,<14",    # nvrtc.h
    "nvidia-cublas>=13,<14",        # cublasLt.h, cublas_api.h
    "nvidia-nvtx>=13,<14",          # nvtx3/nvToolsExt.h (header-only)
]
HEADERS = ("cuda.h", "nvrtc.h", "cublasLt.h")


def _toolkit_roots():
    # Where CMake's FindCUDAToolkit looks, in its order (cmake/CudaHeaders.cmake uses it).
    for variable in ("CUDAToolkit_ROOT", "CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(variable):
            yield os.environ[variable]
    nvcc = shutil.which("nvcc")
    if nvcc:
        yield os.path.dirname(os.path.dirname(os.path.realpath(nvcc)))
    yield "/usr/local/cuda"


def needs_pip_headers(config_settings=None) -> bool:
    choice = (config_settings or {}).get("cmake.define.KJIT_CUDA_HEADERS", "auto")
    if choice in ("pip", "toolkit"):
        return choice == "pip"
    return not any(all(os.path.isfile(os.path.join(root, "include", h)) for h in HEADERS)
                   for root in _toolkit_roots())


def get_requires_for_build_wheel(config_settings=None):
    extra = CUDA_HEADER_PACKAGES if needs_pip_headers(config_settings) else []
    return list(_backend.get_requires_for_build_wheel(config_settings)) + extra


def get_requires_for_build_editable(config_settings=None):
    extra = CUDA_HEADER_PACKAGES if needs_pip_headers(config_settings) else []
    return list(_backend.get_requires_for_build_editable(config_settings)) + extra
