#include "autotune/gpu_timer.h"

#include <algorithm>
#include <vector>

#include "jit/source.h"
#include "kjit/device_buffer.h"
#include "runtime/runtime_state.h"

namespace kjit::autotune {

namespace {
// Several times the largest L2 of the GPUs kjit targets (H200: 60 MB, B200: 126 MB).
constexpr size_t kFlushBytes = size_t{512} << 20;
constexpr char kFlushKernel[] = "kjit::l2_flush";
}  // namespace

absl::StatusOr<std::unique_ptr<GpuTimer>> GpuTimer::Create(const Runtime& runtime) {
  const internal::RuntimeState& rt = internal::StateOf(runtime);
  KJIT_RETURN_IF_ERROR(rt.NeedsDevice());
  KJIT_RETURN_IF_ERROR(rt.MakeCurrent());
  const jit::Driver& cu = *rt.driver;
  std::unique_ptr<GpuTimer> t(new GpuTimer(cu));
  KJIT_ASSIGN_OR_RETURN(
      jit::Source src, jit::RenderSource("l2_flush", {"common.cuh", "l2_flush.cuh"}, {kFlushKernel},
                                         {{"op", "l2_flush"}}));
  KJIT_ASSIGN_OR_RETURN(t->module_, rt.jit->Load(src, rt.target, cu, rt.ctx));
  KJIT_ASSIGN_OR_RETURN(t->flush_, t->module_->Function(kFlushKernel));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemAlloc(&t->buffer_, kFlushBytes), "cuMemAlloc"));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemAlloc(&t->sink_, 16), "cuMemAlloc"));
  KJIT_RETURN_IF_ERROR(
      cu.Check(cu.cuMemsetD8Async(t->buffer_, 1, kFlushBytes, nullptr), "cuMemsetD8Async"));
  t->vectors_ = kFlushBytes / 16;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuEventCreate(&t->start_, CU_EVENT_DEFAULT), "cuEventCreate"));
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuEventCreate(&t->stop_, CU_EVENT_DEFAULT), "cuEventCreate"));
  // Read the memset's dirty lines out once so that they are not written back during a measurement.
  KJIT_RETURN_IF_ERROR(t->FlushL2());
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize"));
  return t;
}

GpuTimer::~GpuTimer() {
  if (start_) cu_.cuEventDestroy(start_);
  if (stop_) cu_.cuEventDestroy(stop_);
  if (buffer_) cu_.cuMemFree(buffer_);
  if (sink_) cu_.cuMemFree(sink_);
}

absl::Status GpuTimer::FlushL2() {
  void* data = reinterpret_cast<void*>(buffer_);
  void* sink = reinterpret_cast<void*>(sink_);
  void* args[] = {&data, &vectors_, &sink};
  return cu_.Check(cu_.cuLaunchKernel(flush_, 1024, 1, 1, 512, 1, 1, 0, nullptr, args, nullptr),
                   "cuLaunchKernel(l2_flush)");
}

absl::StatusOr<Timing> GpuTimer::Time(int repeats, const std::function<absl::Status()>& launch,
                                      const std::function<absl::Status()>& prepare,
                                      double budget_us) {
  if (prepare) KJIT_RETURN_IF_ERROR(prepare());
  KJIT_RETURN_IF_ERROR(launch());
  std::vector<double> us;
  double spent_us = 0;
  for (int i = 0; i < repeats; ++i) {
    if (budget_us > 0 && i >= kMinBudgetedRepeats && spent_us >= budget_us) break;
    if (prepare) KJIT_RETURN_IF_ERROR(prepare());
    KJIT_RETURN_IF_ERROR(FlushL2());
    KJIT_RETURN_IF_ERROR(cu_.Check(cu_.cuEventRecord(start_, nullptr), "cuEventRecord"));
    KJIT_RETURN_IF_ERROR(launch());
    KJIT_RETURN_IF_ERROR(cu_.Check(cu_.cuEventRecord(stop_, nullptr), "cuEventRecord"));
    KJIT_RETURN_IF_ERROR(cu_.Check(cu_.cuEventSynchronize(stop_), "cuEventSynchronize"));
    float ms = 0;
    KJIT_RETURN_IF_ERROR(
        cu_.Check(cu_.cuEventElapsedTime(&ms, start_, stop_), "cuEventElapsedTime"));
    us.push_back(ms * 1000.0);
    spent_us += us.back();
  }
  std::sort(us.begin(), us.end());
  auto at = [&](double q) { return us[static_cast<size_t>(q * (us.size() - 1))]; };
  return Timing{at(0.5), at(0.1), at(0.9), static_cast<int>(us.size())};
}

absl::StatusOr<Timing> TimeDeviceCopy(const Runtime& rt, GpuTimer& timer, size_t bytes,
                                      int repeats) {
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Create(rt, bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Create(rt, bytes));
  KJIT_RETURN_IF_ERROR(src.Fill(1));
  return timer.Time(repeats, [&] { return dst.CopyFrom(src); });
}

}  // namespace kjit::autotune
