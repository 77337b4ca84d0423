#include "tests/gpu/gpu_test_env.h"

namespace kjit::testing {

const absl::StatusOr<Runtime>& GpuRuntime() {
  static const auto* rt = new absl::StatusOr<Runtime>(Runtime::Create());
  return *rt;
}

}  // namespace kjit::testing
