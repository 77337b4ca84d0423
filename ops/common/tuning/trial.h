// Trials: one problem's inputs on the GPU (an op, its shape and a row count), on which candidate
// configs are checked against the fp64 reference and then timed. `kjit bench` and the autotuner
// both measure through them, so a config is never timed unchecked. Each op's trial.h holds its
// trial; this header holds what they share.
//
// The inputs are made once per trial, and every config of the op is checked and timed on the same
// bytes. Inputs are generated on the device (gigabytes at 16384 rows); the checked rows are
// downloaded and compared with the reference computed from exactly those values.
//
//   KJIT_ASSIGN_OR_RETURN(auto trial, CrossEntropyTrial::Create(rt, spec, /*rows=*/4096));
//   KJIT_ASSIGN_OR_RETURN(CrossEntropy ce, rt.CrossEntropy(spec_with_config));
//   KJIT_RETURN_IF_ERROR(trial->Check(ce, Pass::kForwardBackward));  // wrong: Internal, with why
//   KJIT_ASSIGN_OR_RETURN(TimedWork w, trial->Work(ce, Pass::kForwardBackward));
//   KJIT_ASSIGN_OR_RETURN(Timing t, timer.Time(20, w.launch, w.prepare));   // autotune/gpu_timer.h
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kjit/device_buffer.h"
#include "kjit/kjit.h"
#include "ops/common/tuning/compare.h"

namespace kjit::ops {

enum class Pass { kForward, kBackward, kForwardBackward };
const char* Name(Pass p);  // "forward", "backward", "forward_backward"

// One pass of an op on a trial's inputs, for a timer: `launch` enqueues it on the default stream;
// `prepare` (may be null) runs untimed before each launch, e.g. restoring inputs an in-place op
// overwrote. Both refer to the trial and the op, which must outlive them.
struct TimedWork {
  std::function<absl::Status()> launch;
  std::function<absl::Status()> prepare;
};

// Fills rows x cols elements (row_stride apart) of `dtype` with uniform values in [lo, hi) from
// `seed`, on the device; synchronizes.
absl::Status RandomFill(const Runtime& rt, void* data, DType dtype, int64_t rows, int64_t cols,
                        int64_t row_stride, uint64_t seed, float lo, float hi);
// `rows` indices of `type` uniform in [0, modulus), on the device; synchronizes.
absl::Status RandomTargets(const Runtime& rt, void* data, IndexType type, int64_t rows,
                           uint64_t seed, int64_t modulus);

// The rows a trial checks: the first and last 16 (the edges of the grid), and 32 between.
std::vector<int64_t> SampleRows(int64_t rows);
// The values of whole rows `sample` of a [rows, width] buffer, downloaded and decoded.
absl::StatusOr<std::vector<double>> SampledRows(const DeviceBuffer& b, DType dtype, int64_t width,
                                                const std::vector<int64_t>& sample);
// Every mismatch, one per line, as Internal "<what>: wrong results: ...", or OK.
absl::Status Mismatches(const std::string& what,
                        const std::vector<std::pair<std::string, CompareResult>>& results);

}  // namespace kjit::ops
