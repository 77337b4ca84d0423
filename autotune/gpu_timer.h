// GpuTimer: times device work the way every kjit measurement must: warm-up first, a cold L2 before
// each repeat (a read of a buffer several times the L2, JIT-compiled like any kjit kernel), CUDA
// events around the work only, and the median with the 10th and 90th percentiles.
//
//   KJIT_ASSIGN_OR_RETURN(auto timer, GpuTimer::Create(rt));
//   KJIT_ASSIGN_OR_RETURN(Timing t, timer->Time(100, [&] { return op.Forward(nullptr, args); }));
//   KJIT_ASSIGN_OR_RETURN(Timing copy, TimeDeviceCopy(rt, *timer, kCopyBytes, 100));
#pragma once

#include <cuda.h>

#include <functional>
#include <memory>

#include "jit/driver.h"
#include "jit/loaded_module.h"
#include "kjit/runtime.h"

namespace kjit::autotune {

struct Timing {
  double median_us = 0;
  double p10_us = 0;
  double p90_us = 0;
  int repeats = 0;
};

class GpuTimer {
 public:
  // On the runtime's GPU; FailedPrecondition for a compile-only runtime.
  static absl::StatusOr<std::unique_ptr<GpuTimer>> Create(const Runtime& rt);
  ~GpuTimer();
  GpuTimer(const GpuTimer&) = delete;
  GpuTimer& operator=(const GpuTimer&) = delete;

  // `launch` enqueues the work on the default stream; it is run once untimed, then `repeats` times.
  // `prepare`, when given, runs before each launch and before the L2 flush, untimed (e.g. restoring
  // inputs an in-place op overwrote). A `budget_us` > 0 stops the repeats once they have taken
  // about that much GPU time, after kMinBudgetedRepeats at least (Timing::repeats says how many
  // ran): the tuner's candidates of the fused lm_head take 20-80 ms each, and 20 of those for
  // every candidate made a tuning run minutes long without making the medians steadier.
  static constexpr int kMinBudgetedRepeats = 5;
  absl::StatusOr<Timing> Time(int repeats, const std::function<absl::Status()>& launch,
                              const std::function<absl::Status()>& prepare = nullptr,
                              double budget_us = 0);

 private:
  GpuTimer(const jit::Driver& cu) : cu_(cu) {}
  absl::Status FlushL2();

  const jit::Driver& cu_;
  std::shared_ptr<const jit::LoadedModule> module_;
  CUfunction flush_ = nullptr;
  CUdeviceptr buffer_ = 0;
  CUdeviceptr sink_ = 0;
  long long vectors_ = 0;
  CUevent start_ = nullptr;
  CUevent stop_ = nullptr;
};

// The bandwidth every measurement is quoted against: a device-to-device copy of `bytes` (read
// and written: 2 * bytes move), timed like the kernels.
constexpr size_t kCopyBytes = size_t{1} << 30;
absl::StatusOr<Timing> TimeDeviceCopy(const Runtime& rt, GpuTimer& timer, size_t bytes,
                                      int repeats);

}  // namespace kjit::autotune
