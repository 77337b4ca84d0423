// Internal: what a Runtime shares with the ops it creates. Not part of the public API.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

#include "jit/driver.h"
#include "jit/jit.h"
#include "jit/target.h"
#include "autotune/tuning_db.h"

namespace kjit::internal {

struct RuntimeState {
  std::unique_ptr<jit::Jit> jit;
  jit::Target target;
  bool compile_only = false;
  const jit::Driver* driver = nullptr;  // null when compile-only
  CUdevice cu_device = 0;
  CUcontext ctx = nullptr;              // the device's primary context, retained
  jit::DeviceInfo device;
  std::string tuning_path;  // "" when the database is off
  bool autotune = false;
  mutable std::mutex tuning_mu;
  mutable std::shared_ptr<const autotune::TuningDb> tuning;  // null: none (yet); under tuning_mu

  std::shared_ptr<const autotune::TuningDb> Tuning() const;
  // Whether work on `stream` is being captured into a graph (nothing may block or sync then).
  bool Capturing(CUstream stream) const;
  // KJIT_AUTOTUNE: runs `kjit-tune --spec` for one op spec (as runtime/tuning.h's SpecToJson) at
  // `rows` and reloads the database. A failure is reported on stderr; the caller goes on untuned.
  void TuneNow(const std::string& spec_json, int64_t rows) const;

  ~RuntimeState();
  // Makes the runtime's context current on this thread if another (or none) is; no sync.
  absl::Status MakeCurrent() const;
  // FailedPrecondition for a compile-only runtime: ops call it after checking their arguments.
  absl::Status NeedsDevice() const;
  // Launches a kernel whose only argument is a params struct, on a 1-D grid of 1-D clusters of
  // `cluster` blocks (1: no cluster), with `shared_bytes` of dynamic shared memory; no sync.
  // `overlap_previous` (sm_90 and newer; ignored before): the kernel may start before the one
  // before it on the stream has ended (programmatic dependent launch), so it must wait for it
  // (common.cuh's wait_for_previous_kernel) before reading what it writes.
  absl::Status Launch(CUfunction fn, int64_t grid, int block, CUstream stream, void* params,
                      int cluster = 1, int shared_bytes = 0, bool overlap_previous = false) const;
  // Lets `fn` have `shared_bytes` of dynamic shared memory (over 48 KB needs opting in).
  absl::Status AllowSharedBytes(CUfunction fn, int shared_bytes) const;
};

}  // namespace kjit::internal
