// DeviceBuffer: an owning device allocation made through the runtime's driver, for programs that
// have no CUDA runtime of their own (tools, tests, examples). Ops never allocate; callers do, with
// this or with their framework's allocator. A buffer keeps its runtime's context alive.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::DeviceBuffer buf, kjit::DeviceBuffer::Create(rt, bytes));
//   KJIT_RETURN_IF_ERROR(buf.Upload(host.data(), bytes));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kjit/dtype.h"
#include "kjit/runtime.h"

namespace kjit {

class DeviceBuffer {
 public:
  // FailedPrecondition for a compile-only runtime; ResourceExhausted when the GPU is full.
  static absl::StatusOr<DeviceBuffer> Create(const Runtime& rt, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t size() const { return bytes_; }
  // Synchronous copies between host memory and [offset, offset + bytes) of the buffer.
  absl::Status Upload(const void* host, size_t bytes, size_t offset = 0) const;
  absl::Status Download(void* host, size_t bytes, size_t offset = 0) const;
  // Fills every byte with `value` (e.g. 0xFF: NaN in every float type, to catch unwritten output);
  // synchronizes.
  absl::Status Fill(unsigned char value) const;
  // Copies all of `src` (no larger than this buffer) on the default stream; does not synchronize.
  absl::Status CopyFrom(const DeviceBuffer& src) const;

 private:
  DeviceBuffer(std::shared_ptr<const internal::RuntimeState> rt, uintptr_t ptr, size_t bytes)
      : rt_(std::move(rt)), ptr_(ptr), bytes_(bytes) {}
  std::shared_ptr<const internal::RuntimeState> rt_;
  uintptr_t ptr_ = 0;
  size_t bytes_ = 0;
};

// Values (rounded to `dtype`) copied into a new buffer of that dtype, and back.
absl::StatusOr<DeviceBuffer> UploadValues(const Runtime& rt, const std::vector<double>& values,
                                          DType dtype);
absl::StatusOr<std::vector<double>> DownloadValues(const DeviceBuffer& buffer, DType dtype,
                                                   size_t offset_bytes = 0,
                                                   size_t bytes = SIZE_MAX);

}  // namespace kjit
