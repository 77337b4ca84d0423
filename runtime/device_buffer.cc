#include "runtime/device_buffer.h"

#include <algorithm>

#include <fmt/format.h>

#include "autotune/host_convert.h"

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

absl::StatusOr<DeviceBuffer> UploadValues(const Runtime& rt, const std::vector<double>& values,
                                          DType dtype) {
  const std::vector<unsigned char> bytes = autotune::Encode(values, dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes.size()));
  KJIT_RETURN_IF_ERROR(b.Upload(bytes.data(), bytes.size()));
  return b;
}

absl::StatusOr<std::vector<double>> DownloadValues(const DeviceBuffer& buffer, DType dtype,
                                                   size_t offset_bytes, size_t bytes) {
  bytes = std::min(bytes, buffer.size() - std::min(offset_bytes, buffer.size()));
  std::vector<unsigned char> raw(bytes);
  KJIT_RETURN_IF_ERROR(buffer.Download(raw.data(), raw.size(), offset_bytes));
  return autotune::Decode(raw, dtype);
}

}  // namespace kjit
