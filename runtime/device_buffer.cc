#include "runtime/device_buffer.h"

#include <fmt/format.h>

namespace kjit {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(const Runtime& rt, size_t bytes) {
  const jit::Driver* cu = rt.driver();
  if (cu == nullptr) return absl::FailedPreconditionError("DeviceBuffer: runtime is compile-only");
  KJIT_RETURN_IF_ERROR(cu->Check(cu->cuCtxSetCurrent(rt.context()), "cuCtxSetCurrent"));
  CUdeviceptr ptr = 0;
  CUresult r = cu->cuMemAlloc(&ptr, bytes == 0 ? 1 : bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return absl::ResourceExhaustedError(fmt::format("out of device memory allocating {} bytes", bytes));
  }
  KJIT_RETURN_IF_ERROR(cu->Check(r, "cuMemAlloc"));
  return DeviceBuffer(cu, ptr, bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : cu_(o.cu_), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != 0) cu_->cuMemFree(ptr_);
    cu_ = o.cu_;
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) cu_->cuMemFree(ptr_);
}

absl::Status DeviceBuffer::Upload(const void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return absl::OutOfRangeError("DeviceBuffer::Upload past the end");
  return cu_->Check(cu_->cuMemcpyHtoD(ptr_ + offset, host, bytes), "cuMemcpyHtoD");
}

absl::Status DeviceBuffer::Download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return absl::OutOfRangeError("DeviceBuffer::Download past the end");
  return cu_->Check(cu_->cuMemcpyDtoH(host, ptr_ + offset, bytes), "cuMemcpyDtoH");
}

absl::Status DeviceBuffer::Fill(unsigned char value) const {
  KJIT_RETURN_IF_ERROR(cu_->Check(cu_->cuMemsetD8Async(ptr_, value, bytes_, nullptr), "cuMemsetD8Async"));
  return cu_->Check(cu_->cuCtxSynchronize(), "cuCtxSynchronize");
}

}  // namespace kjit
