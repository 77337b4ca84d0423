# kjit_cuda_headers: the include directories of the only CUDA files the build reads: cuda.h,
# nvrtc.h and cublasLt.h with what they include, and NVTX's nvtx3/ (nccl.h only where it is found:
# ops/cross_entropy/nccl.h declares what kjit calls). libcuda, libnvrtc and libcublasLt are
# dlopen()ed at run time, so nothing links them.
#
# KJIT_CUDA_HEADERS picks where they come from:
#   toolkit  a CUDA toolkit (find_package(CUDAToolkit): CUDAToolkit_ROOT, nvcc on PATH, /usr/local/cuda)
#   pip      pip's nvidia-cuda-runtime, -crt, -cccl, -nvrtc, nvidia-cublas and -nvtx in the Python
#            environment that builds, as python/pep517/kjit_backend.py asks for them
#   auto     the toolkit when there is one, else pip's (the default)
# The test suites need a toolkit (they link its libcuda stub).
set(KJIT_CUDA_HEADERS auto CACHE STRING "Where cuda.h and nvrtc.h come from: auto, toolkit or pip")
set_property(CACHE KJIT_CUDA_HEADERS PROPERTY STRINGS auto toolkit pip)

add_library(kjit_cuda_headers INTERFACE)
if(NOT KJIT_CUDA_HEADERS STREQUAL "pip")
  if(KJIT_CUDA_HEADERS STREQUAL "toolkit")
    find_package(CUDAToolkit REQUIRED)
  else()
    find_package(CUDAToolkit QUIET)
  endif()
endif()

if(CUDAToolkit_FOUND)
  target_link_libraries(kjit_cuda_headers INTERFACE CUDA::toolkit)
  message(STATUS "kjit: CUDA headers from the toolkit in ${CUDAToolkit_INCLUDE_DIRS}")
  return()
endif()

# pip's packages: CUDA 13's put every header in nvidia/cu13/include ("nvidia" is a namespace package).
find_package(Python COMPONENTS Interpreter)
set(kjit_pip_dirs "")
if(Python_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import nvidia, os; print(';'.join(os.path.join(p, 'cu13', 'include') for p in nvidia.__path__))"
    OUTPUT_VARIABLE kjit_pip_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
set(kjit_cuda_dirs "")
foreach(header cuda.h nvrtc.h cublasLt.h crt/host_defines.h nv/target nvtx3/nvToolsExt.h)
  string(MAKE_C_IDENTIFIER "${header}" id)
  find_path(KJIT_PIP_${id}_DIR ${header} HINTS ${kjit_pip_dirs} NO_DEFAULT_PATH)
  if(NOT KJIT_PIP_${id}_DIR)
    message(FATAL_ERROR "kjit needs the CUDA headers (CUDA 13) to build, and found neither a CUDA "
      "toolkit nor pip's ${header} in the Python environment of ${Python_EXECUTABLE}.\n"
      "Fix: install the toolkit (or set CUDAToolkit_ROOT), or `python -m pip install "
      "'nvidia-cuda-runtime>=13,<14' 'nvidia-cuda-crt>=13,<14' 'nvidia-cuda-cccl>=13,<14' "
      "'nvidia-cuda-nvrtc>=13,<14' 'nvidia-cublas>=13,<14' 'nvidia-nvtx>=13,<14'` into that "
      "environment.")
  endif()
  list(APPEND kjit_cuda_dirs ${KJIT_PIP_${id}_DIR})
endforeach()
list(REMOVE_DUPLICATES kjit_cuda_dirs)
target_include_directories(kjit_cuda_headers SYSTEM INTERFACE ${kjit_cuda_dirs})
message(STATUS "kjit: CUDA headers from pip's packages: ${kjit_cuda_dirs}")
if(KJIT_BUILD_TESTS)
  message(FATAL_ERROR "kjit's test suites need a CUDA toolkit (its libcuda stub); configure with "
    "-DKJIT_BUILD_TESTS=OFF to build without one")
endif()
