# kjit_cuda_headers: the include directory of cuda.h and nvrtc.h, the only CUDA files the build
# reads (libcuda and libnvrtc are dlopen()ed at run time, so nothing links them).
#
# KJIT_CUDA_HEADERS picks where they come from:
#   toolkit  a CUDA toolkit (find_package(CUDAToolkit): CUDAToolkit_ROOT, nvcc on PATH, /usr/local/cuda)
#   pip      pip's nvidia-cuda-runtime (cuda.h) and nvidia-cuda-nvrtc (nvrtc.h) in the Python
#            environment that builds, as pyproject.toml's build requirements install them
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

# pip's packages: CUDA 13's put every header in nvidia/cu13/include, CUDA 12's in
# nvidia/cuda_runtime/include and nvidia/cuda_nvrtc/include ("nvidia" is a namespace package).
find_package(Python COMPONENTS Interpreter)
set(kjit_pip_dirs "")
if(Python_Interpreter_FOUND)
  execute_process(
    COMMAND ${Python_EXECUTABLE} -c
      "import nvidia, os; print(';'.join(os.path.join(p, d, 'include') for p in nvidia.__path__ for d in ('cu13', 'cuda_runtime', 'cuda_nvrtc')))"
    OUTPUT_VARIABLE kjit_pip_dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
endif()
find_path(KJIT_CUDA_H_DIR cuda.h HINTS ${kjit_pip_dirs} NO_DEFAULT_PATH)
find_path(KJIT_NVRTC_H_DIR nvrtc.h HINTS ${kjit_pip_dirs} NO_DEFAULT_PATH)
if(NOT KJIT_CUDA_H_DIR OR NOT KJIT_NVRTC_H_DIR)
  message(FATAL_ERROR "kjit needs cuda.h and nvrtc.h (CUDA 12.8 or newer) to build, and found "
    "neither a CUDA toolkit nor pip's headers in the Python environment of ${Python_EXECUTABLE}.\n"
    "Fix: install the toolkit (or set CUDAToolkit_ROOT), or "
    "`python -m pip install 'nvidia-cuda-runtime>=13,<14' 'nvidia-cuda-nvrtc>=13,<14'` into that environment.")
endif()
target_include_directories(kjit_cuda_headers SYSTEM INTERFACE ${KJIT_CUDA_H_DIR} ${KJIT_NVRTC_H_DIR})
message(STATUS "kjit: CUDA headers from pip's packages: ${KJIT_CUDA_H_DIR}, ${KJIT_NVRTC_H_DIR}")
if(KJIT_BUILD_TESTS)
  message(FATAL_ERROR "kjit's test suites need a CUDA toolkit (its libcuda stub); configure with "
    "-DKJIT_BUILD_TESTS=OFF to build without one")
endif()
