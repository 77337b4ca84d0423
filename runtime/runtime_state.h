// Internal: what a Runtime shares with the ops it creates. Not part of the public API.
#pragma once

#include <memory>

#include "jit/driver.h"
#include "jit/jit.h"
#include "jit/target.h"

namespace kjit::internal {

struct RuntimeState {
  std::unique_ptr<jit::Jit> jit;
  jit::Target target;
  bool compile_only = false;
  const jit::Driver* driver = nullptr;  // null when compile-only
  CUdevice cu_device = 0;
  CUcontext ctx = nullptr;              // the device's primary context, retained
  jit::DeviceInfo device;

  ~RuntimeState();
  // Makes the runtime's context current on this thread if another (or none) is; no sync.
  absl::Status MakeCurrent() const;
};

}  // namespace kjit::internal
