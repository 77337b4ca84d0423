// DevicePool: the allocator of one path of the fine-tuning step, so that its peak device memory is
// counted rather than guessed. Every buffer a path uses comes from its pool; the pool records the
// bytes live now and at most (its high-water mark), and cross-checks with cuMemGetInfo.
//
// A freed block is kept and handed out again for a request of the same size, as a framework's
// caching allocator does: after the first step, steps allocate nothing from the driver (cuMemFree
// would synchronize the device inside a timed step), and freeing a buffer whose last kernel is
// still queued is safe because everything runs in one stream.
//
//   DevicePool pool(rt, "baseline");
//   KJIT_ASSIGN_OR_RETURN(Tensor t, pool.NewTensor("logits", DType::kBF16, tokens, vocab));
//   t.Free();                                        // live bytes drop; the block stays cached
//   fmt::print("{} peak\n", pool.stats().peak_bytes);
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "jit/driver.h"
#include "kjit/kjit.h"

namespace finetune {

class DevicePool;

// One block of a pool; returns to it when destroyed or freed.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Free(); }

  void* data() const { return reinterpret_cast<void*>(ptr_); }
  size_t bytes() const { return bytes_; }
  void Free();

 private:
  friend class DevicePool;
  Buffer(DevicePool* pool, CUdeviceptr ptr, size_t bytes) : pool_(pool), ptr_(ptr), bytes_(bytes) {}
  DevicePool* pool_ = nullptr;
  CUdeviceptr ptr_ = 0;
  size_t bytes_ = 0;
};

// A buffer with its shape: what an eager framework calls a tensor.
struct Tensor {
  Buffer buffer;
  kjit::TensorView view;
  void Free() {
    buffer.Free();
    view = {};
  }
};

class DevicePool {
 public:
  struct Stats {
    size_t live_bytes = 0;
    size_t peak_bytes = 0;           // the most bytes live at once: what the path needs
    size_t peak_reserved_bytes = 0;  // the most taken from the driver (live + cached blocks)
    // cuMemGetInfo's used memory after each cuMemAlloc, minus its value when the pool was made:
    // an independent check of peak_reserved_bytes (the driver rounds up to its page size).
    size_t device_peak_delta_bytes = 0;
  };

  // `name` ("baseline", "kjit") appears in errors. The runtime must outlive the pool.
  DevicePool(const kjit::Runtime& rt, std::string name);
  // Every buffer must be gone by now.
  ~DevicePool();
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;

  // ResourceExhausted, naming the pool, `what` and the bytes this pool then needed, when the
  // device has no room even after the cached blocks are released.
  absl::StatusOr<Buffer> Allocate(const std::string& what, size_t bytes);
  absl::StatusOr<Tensor> NewTensor(const std::string& what, kjit::DType dtype, int64_t rows,
                                   int64_t cols);

  const std::string& name() const { return name_; }
  Stats stats() const { return stats_; }

 private:
  friend class Buffer;
  void Release(CUdeviceptr ptr, size_t bytes);
  // Returns every cached block to the driver (after the stream is idle: a queued kernel may still
  // use one).
  absl::Status ReleaseCached();
  size_t DeviceUsed() const;

  const kjit::jit::Driver& cu_;
  const std::string name_;
  std::multimap<size_t, CUdeviceptr> cached_;  // free blocks by size
  size_t reserved_bytes_ = 0;
  size_t device_used_at_start_ = 0;
  Stats stats_;
};

// "1.25 GiB", "64.0 MiB", "512 B": sizes for people.
std::string FormatBytes(double bytes);

}  // namespace finetune
