// Compilation targets: which machine code NVRTC emits and for which GPU.
//
// A target is CUBIN for one real arch ("sm_90", or "sm_90a" for arch-specific features) or PTX for
// a virtual arch ("compute_90") that the driver JIT-compiles at load. kjit prefers CUBIN for the
// exact arch of the device and falls back to PTX only when NVRTC lacks that arch and the driver is
// at least as new as NVRTC (an older driver rejects newer PTX with
// CUDA_ERROR_UNSUPPORTED_PTX_VERSION).
//
//   KJIT_ASSIGN_OR_RETURN(Target t, ParseTarget("sm_100"));
//   KJIT_ASSIGN_OR_RETURN(Target t, SelectTargetForDevice(90, nvrtc->supported_archs(),
//                                                         nvrtc_version, driver_version));
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kjit/status.h"

namespace kjit::jit {

struct Target {
  enum class Kind { kCubin, kPtx };
  Kind kind = Kind::kCubin;
  int arch = 0;                // compute capability as major*10+minor, e.g. 90, 100, 120
  bool arch_specific = false;  // the "a" suffix: sm_90a, sm_100a

  std::string ToString() const;  // "sm_90", "sm_90a", "compute_90"
  // NVRTC's --gpu-architecture value; the same spelling.
  std::string GpuArchitectureOption() const { return "--gpu-architecture=" + ToString(); }
  bool operator==(const Target&) const = default;
};

// "sm_XY", "sm_XYa", "compute_XY"; anything else is InvalidArgument naming the accepted forms.
absl::StatusOr<Target> ParseTarget(std::string_view text);

// Checks that NVRTC can emit `target` (its arch is among `supported_archs`).
absl::Status CheckNvrtcSupports(const Target& target, const std::vector<int>& supported_archs);

// The target for a device of compute capability `cc`: CUBIN when NVRTC supports cc, else PTX for
// the newest supported arch below cc if the driver can JIT it, else FailedPrecondition with a fix.
// `nvrtc_version` and `driver_version` are in the driver's encoding (13000 = 13.0).
absl::StatusOr<Target> SelectTargetForDevice(int cc, const std::vector<int>& supported_archs,
                                             int nvrtc_version, int driver_version);

// The default prebuild targets when there is no GPU: Hopper and Blackwell datacenter parts.
std::vector<Target> DefaultPrebuildTargets();

}  // namespace kjit::jit
