// Paths the CPU suites need from the build: the kjit binary and the toolkit's stub libcuda.
//
//   auto d = jit::Driver::Load({kjit::testing::StubLibcuda()});   // CUDA_ERROR_STUB_LIBRARY
#pragma once

#include <filesystem>
#include <string>

#ifndef KJIT_STUB_LIBCUDA
#error "KJIT_STUB_LIBCUDA must name the toolkit's stubs/libcuda.so"
#endif

namespace kjit::testing {

// Where the build found the toolkit, else where a runtime image keeps the stub (some toolkits have
// lib64/ only), so the suite also runs on a machine other than the one that built it.
inline std::string StubLibcuda() {
  for (const char* p : {KJIT_STUB_LIBCUDA, "/usr/local/cuda/lib64/stubs/libcuda.so"}) {
    if (std::filesystem::exists(p)) return p;
  }
  return KJIT_STUB_LIBCUDA;
}

}  // namespace kjit::testing
