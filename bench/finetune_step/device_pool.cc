#include "bench/finetune_step/device_pool.h"

#include <fmt/format.h>

#include <algorithm>

#include "runtime/runtime_state.h"

namespace finetune {

Buffer::Buffer(Buffer&& other) noexcept
    : pool_(other.pool_), ptr_(other.ptr_), bytes_(other.bytes_) {
  other.pool_ = nullptr;
  other.ptr_ = 0;
}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    Free();
    pool_ = other.pool_;
    ptr_ = other.ptr_;
    bytes_ = other.bytes_;
    other.pool_ = nullptr;
    other.ptr_ = 0;
  }
  return *this;
}

void Buffer::Free() {
  if (pool_ != nullptr) pool_->Release(ptr_, bytes_);
  pool_ = nullptr;
  ptr_ = 0;
  bytes_ = 0;
}

DevicePool::DevicePool(const kjit::Runtime& rt, std::string name)
    : cu_(*kjit::internal::StateOf(rt).driver), name_(std::move(name)) {
  device_used_at_start_ = DeviceUsed();
}

DevicePool::~DevicePool() {
  // Errors cannot be reported from here; the process is about to free the context anyway.
  (void)ReleaseCached();
}

size_t DevicePool::DeviceUsed() const {
  size_t free = 0, total = 0;
  if (cu_.cuMemGetInfo(&free, &total) != CUDA_SUCCESS) return 0;
  return total - free;
}

absl::StatusOr<Buffer> DevicePool::Allocate(const std::string& what, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  CUdeviceptr ptr = 0;
  if (auto it = cached_.find(bytes); it != cached_.end()) {
    ptr = it->second;
    cached_.erase(it);
  } else {
    CUresult r = cu_.cuMemAlloc(&ptr, bytes);
    if (r == CUDA_ERROR_OUT_OF_MEMORY && !cached_.empty()) {
      // Blocks of other sizes may be what stands in the way, as in any caching allocator.
      KJIT_RETURN_IF_ERROR(ReleaseCached());
      r = cu_.cuMemAlloc(&ptr, bytes);
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      size_t free = 0, total = 0;
      cu_.cuMemGetInfo(&free, &total);
      return absl::ResourceExhaustedError(fmt::format(
          "{}: out of device memory allocating {} ({}) while {} of its buffers were live: it "
          "needs at least {}; the device has {} free of {}",
          name_, what, FormatBytes(bytes), FormatBytes(stats_.live_bytes),
          FormatBytes(stats_.live_bytes + bytes), FormatBytes(free), FormatBytes(total)));
    }
    KJIT_RETURN_IF_ERROR(cu_.Check(r, "cuMemAlloc"));
    reserved_bytes_ += bytes;
    stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, reserved_bytes_);
    const size_t used = DeviceUsed();
    if (used > device_used_at_start_) {
      stats_.device_peak_delta_bytes =
          std::max(stats_.device_peak_delta_bytes, used - device_used_at_start_);
    }
  }
  stats_.live_bytes += bytes;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.live_bytes);
  return Buffer(this, ptr, bytes);
}

absl::StatusOr<Tensor> DevicePool::NewTensor(const std::string& what, kjit::DType dtype,
                                             int64_t rows, int64_t cols) {
  KJIT_ASSIGN_OR_RETURN(Buffer b, Allocate(what, rows * cols * kjit::SizeOf(dtype)));
  const kjit::TensorView view = kjit::TensorView::Matrix(b.data(), dtype, rows, cols);
  return Tensor{std::move(b), view};
}

void DevicePool::Release(CUdeviceptr ptr, size_t bytes) {
  stats_.live_bytes -= bytes;
  cached_.emplace(bytes, ptr);
}

absl::Status DevicePool::ReleaseCached() {
  if (cached_.empty()) return absl::OkStatus();
  KJIT_RETURN_IF_ERROR(cu_.Check(cu_.cuCtxSynchronize(), "cuCtxSynchronize"));
  for (const auto& [bytes, ptr] : cached_) {
    KJIT_RETURN_IF_ERROR(cu_.Check(cu_.cuMemFree(ptr), "cuMemFree"));
    reserved_bytes_ -= bytes;
  }
  cached_.clear();
  return absl::OkStatus();
}

std::string FormatBytes(double bytes) {
  if (bytes >= double{1 << 30}) return fmt::format("{:.2f} GiB", bytes / (1 << 30));
  if (bytes >= double{1 << 20}) return fmt::format("{:.1f} MiB", bytes / (1 << 20));
  if (bytes >= double{1 << 10}) return fmt::format("{:.1f} KiB", bytes / (1 << 10));
  return fmt::format("{:.0f} B", bytes);
}

}  // namespace finetune
