#include "kjit/device_buffer.h"

#include <algorithm>

#include <fmt/format.h>

#include "kjit/host_convert.h"
#include "runtime/runtime_state.h"

namespace kjit {

absl::StatusOr<DeviceBuffer> DeviceBuffer::Create(const Runtime& runtime, size_t bytes) {
  std::shared_ptr<const internal::RuntimeState> rt = internal::RuntimeAccess::Shared(runtime);
  if (rt->compile_only)
    return absl::FailedPreconditionError("DeviceBuffer: runtime is compile-only");
  KJIT_RETURN_IF_ERROR(rt->MakeCurrent());
  const jit::Driver& cu = *rt->driver;
  CUdeviceptr ptr = 0;
  CUresult r = cu.cuMemAlloc(&ptr, bytes == 0 ? 1 : bytes);
  if (r == CUDA_ERROR_OUT_OF_MEMORY) {
    return absl::ResourceExhaustedError(
        fmt::format("out of device memory allocating {} bytes", bytes));
  }
  KJIT_RETURN_IF_ERROR(cu.Check(r, "cuMemAlloc"));
  return DeviceBuffer(std::move(rt), static_cast<uintptr_t>(ptr), bytes);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : rt_(std::move(o.rt_)), ptr_(o.ptr_), bytes_(o.bytes_) {
  o.ptr_ = 0;
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != 0) rt_->driver->cuMemFree(ptr_);
    rt_ = std::move(o.rt_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = 0;
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != 0) rt_->driver->cuMemFree(ptr_);
}

absl::Status DeviceBuffer::Upload(const void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return absl::OutOfRangeError("DeviceBuffer::Upload past the end");
  const jit::Driver& cu = *rt_->driver;
  KJIT_RETURN_IF_ERROR(cu.Check(cu.cuMemcpyHtoD(ptr_ + offset, host, bytes), "cuMemcpyHtoD"));
  // From pageable memory cuMemcpyHtoD returns once the bytes are staged, before the DMA has
  // landed; only the legacy default stream is ordered after it, so a kernel on a non-blocking
  // stream could read the old contents (the suspected cause of a direct launch's +inf loss on an
  // H100). Waiting for the default stream makes the copy done when this returns, as promised.
  return cu.Check(cu.cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

absl::Status DeviceBuffer::Download(void* host, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) return absl::OutOfRangeError("DeviceBuffer::Download past the end");
  const jit::Driver& cu = *rt_->driver;
  return cu.Check(cu.cuMemcpyDtoH(host, ptr_ + offset, bytes), "cuMemcpyDtoH");
}

absl::Status DeviceBuffer::Fill(unsigned char value) const {
  const jit::Driver& cu = *rt_->driver;
  KJIT_RETURN_IF_ERROR(
      cu.Check(cu.cuMemsetD8Async(ptr_, value, bytes_, nullptr), "cuMemsetD8Async"));
  return cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

absl::Status DeviceBuffer::CopyFrom(const DeviceBuffer& src) const {
  if (src.bytes_ > bytes_) return absl::OutOfRangeError("DeviceBuffer::CopyFrom a larger buffer");
  const jit::Driver& cu = *rt_->driver;
  return cu.Check(cu.cuMemcpyDtoDAsync(ptr_, src.ptr_, src.bytes_, nullptr), "cuMemcpyDtoDAsync");
}

absl::StatusOr<DeviceBuffer> UploadValues(const Runtime& rt, const std::vector<double>& values,
                                          DType dtype) {
  const std::vector<unsigned char> bytes = Encode(values, dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes.size()));
  KJIT_RETURN_IF_ERROR(b.Upload(bytes.data(), bytes.size()));
  return b;
}

absl::StatusOr<std::vector<double>> DownloadValues(const DeviceBuffer& buffer, DType dtype,
                                                   size_t offset_bytes, size_t bytes) {
  bytes = std::min(bytes, buffer.size() - std::min(offset_bytes, buffer.size()));
  std::vector<unsigned char> raw(bytes);
  KJIT_RETURN_IF_ERROR(buffer.Download(raw.data(), raw.size(), offset_bytes));
  return Decode(raw, dtype);
}

}  // namespace kjit
