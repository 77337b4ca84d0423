#include "ops/common/tuning/trial.h"

#include <algorithm>

#include <fmt/format.h>

#include "jit/instantiation.h"
#include "jit/source.h"
#include "runtime/runtime_state.h"

namespace kjit::ops {

const char* Name(Pass p) {
  switch (p) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kForwardBackward: return "forward_backward";
  }
  return "?";
}

namespace {

constexpr int kFillThreads = 256;
constexpr int64_t kFillBlocks = 4096;

absl::StatusOr<CUfunction> FillKernel(const internal::RuntimeState& rt, const std::string& expr) {
  KJIT_ASSIGN_OR_RETURN(jit::Source src,
                        jit::RenderSource("random_fill", {"common.cuh", "random_fill.cuh"}, {expr},
                                          {{"op", "random_fill"}, {"kernel", expr}}));
  KJIT_ASSIGN_OR_RETURN(auto module, rt.jit->Load(src, rt.target, *rt.driver, rt.ctx));
  // The Jit keeps loaded modules for the context's life, so the function outlives `module`.
  return module->Function(expr);
}

absl::Status LaunchAndSync(const internal::RuntimeState& rt, CUfunction fn, void** args) {
  const jit::Driver& cu = *rt.driver;
  KJIT_RETURN_IF_ERROR(rt.MakeCurrent());
  KJIT_RETURN_IF_ERROR(cu.Check(
      cu.cuLaunchKernel(fn, kFillBlocks, 1, 1, kFillThreads, 1, 1, 0, nullptr, args, nullptr),
      "cuLaunchKernel(random_fill)"));
  return cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace

absl::Status RandomFill(const Runtime& runtime, void* data, DType dtype, int64_t rows, int64_t cols,
                        int64_t row_stride, uint64_t seed, float lo, float hi) {
  const internal::RuntimeState& rt = internal::StateOf(runtime);
  KJIT_RETURN_IF_ERROR(rt.NeedsDevice());
  KJIT_ASSIGN_OR_RETURN(CUfunction fn,
                        FillKernel(rt, jit::Instantiate("kjit::random_fill", dtype)));
  long long r = rows, c = cols, stride = row_stride;
  unsigned long long s = seed;
  void* args[] = {&data, &r, &c, &stride, &s, &lo, &hi};
  return LaunchAndSync(rt, fn, args);
}

absl::Status RandomTargets(const Runtime& runtime, void* data, IndexType type, int64_t rows,
                           uint64_t seed, int64_t modulus) {
  const internal::RuntimeState& rt = internal::StateOf(runtime);
  KJIT_RETURN_IF_ERROR(rt.NeedsDevice());
  KJIT_ASSIGN_OR_RETURN(CUfunction fn,
                        FillKernel(rt, jit::Instantiate("kjit::random_targets", type)));
  long long n = rows, m = modulus;
  unsigned long long s = seed;
  void* args[] = {&data, &n, &s, &m};
  return LaunchAndSync(rt, fn, args);
}

std::vector<int64_t> SampleRows(int64_t rows) {
  std::vector<int64_t> out;
  const int64_t stride = std::max<int64_t>(1, rows / 32);
  for (int64_t r = 0; r < rows; ++r) {
    if (r < 16 || r >= rows - 16 || r % stride == stride / 2) out.push_back(r);
  }
  return out;
}

absl::StatusOr<std::vector<double>> SampledRows(const DeviceBuffer& b, DType dtype, int64_t width,
                                                const std::vector<int64_t>& sample) {
  const size_t row_bytes = width * SizeOf(dtype);
  std::vector<double> out;
  for (int64_t r : sample) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> row,
                          DownloadValues(b, dtype, r * row_bytes, row_bytes));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

absl::Status Mismatches(const std::string& what,
                        const std::vector<std::pair<std::string, CompareResult>>& results) {
  std::string problems;
  for (const auto& [name, r] : results) {
    if (!r.ok) problems += "\n  " + r.Describe(name);
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(fmt::format("{}: wrong results:{}", what, problems));
}

}  // namespace kjit::ops
