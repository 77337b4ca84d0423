// Internal: what a Runtime shares with the ops it creates, and how the rest of kjit reaches it.
// Not installed; the public Runtime (kjit/runtime.h) exposes none of it.
//
//   const internal::RuntimeState& rt = internal::StateOf(runtime);
//   KJIT_ASSIGN_OR_RETURN(auto module, rt.jit->Load(source, rt.target, *rt.driver, rt.ctx));
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "jit/driver.h"
#include "jit/jit.h"
#include "jit/target.h"
#include "kjit/runtime.h"
#include "runtime/tuning_db.h"

namespace kjit::internal {

struct RuntimeState {
  std::unique_ptr<jit::Jit> jit;
  jit::Target target;
  bool compile_only = false;
  const jit::Driver* driver = nullptr;  // null when compile-only
  CUdevice cu_device = 0;
  CUcontext ctx = nullptr;  // the device's primary context, retained
  DeviceInfo device;
  std::string tuning_path;  // "" when the database is off
  bool autotune = false;
  WarningSink warnings;  // never null
  mutable std::mutex tuning_mu;
  mutable std::shared_ptr<const TuningDb> tuning;  // null: none (yet); under tuning_mu
  mutable std::once_flag no_tuner_warned;

  std::shared_ptr<const TuningDb> Tuning() const;
  // Whether work on `stream` is being captured into a graph (nothing may block or sync then).
  bool Capturing(CUstream stream) const;
  // KJIT_AUTOTUNE: has the default tuner (kjit/runtime.h) tune one op spec (its JSON, as
  // ops/registry.h's SpecToJson) at `rows`, then reloads the database. A failure is a warning, and
  // so is the lack of a tuner (once); the caller goes on untuned.
  void TuneNow(const std::string& spec_json, int64_t rows) const;
  void Warn(std::string_view message) const { warnings(message); }

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

// The one door from a public Runtime to its state.
struct RuntimeAccess {
  static const RuntimeState& State(const Runtime& rt) { return *rt.state_; }
  static const std::shared_ptr<RuntimeState>& Shared(const Runtime& rt) { return rt.state_; }
};
inline const RuntimeState& StateOf(const Runtime& rt) { return RuntimeAccess::State(rt); }

// What the public API reports of a build: of one program, or of an op's programs (the first
// describes the op; BuildInfo says how the rest are summed up).
BuildInfo ToBuildInfo(const jit::Jit::Built& built);
BuildInfo ToBuildInfo(const std::vector<jit::Jit::Built>& programs);

}  // namespace kjit::internal
