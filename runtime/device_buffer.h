// DeviceBuffer: an owning device allocation made through kjit's lazily loaded driver, for tools,
// tests and examples that have no CUDA runtime of their own. Ops never allocate; callers do.
//
//   KJIT_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::Create(rt, bytes));
//   KJIT_RETURN_IF_ERROR(buf.Upload(host.data(), bytes));
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/runtime.h"

namespace kjit {

class DeviceBuffer {
 public:
  static absl::StatusOr<DeviceBuffer> Create(const Runtime& rt, size_t bytes);
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t size() const { return bytes_; }
  absl::Status Upload(const void* host, size_t bytes, size_t offset = 0) const;
  absl::Status Download(void* host, size_t bytes, size_t offset = 0) const;
  // Fills every byte with `value` (e.g. 0xFF: NaN in every float type, to catch unwritten output).
  absl::Status Fill(unsigned char value) const;

 private:
  DeviceBuffer(const jit::Driver* cu, CUdeviceptr ptr, size_t bytes) : cu_(cu), ptr_(ptr), bytes_(bytes) {}
  const jit::Driver* cu_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// Values (rounded to `dtype`) copied into a new buffer of that dtype, and back.
absl::StatusOr<DeviceBuffer> UploadValues(const Runtime& rt, const std::vector<double>& values,
                                          DType dtype);
absl::StatusOr<std::vector<double>> DownloadValues(const DeviceBuffer& buffer, DType dtype,
                                                   size_t offset_bytes = 0,
                                                   size_t bytes = SIZE_MAX);

}  // namespace kjit
