#include "jit/target.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

namespace kjit::jit {

std::string Target::ToString() const {
  return fmt::format("{}_{}{}", kind == Kind::kCubin ? "sm" : "compute", arch,
                     arch_specific ? "a" : "");
}

absl::StatusOr<Target> ParseTarget(std::string_view text) {
  Target t;
  std::string_view rest;
  if (text.starts_with("sm_")) {
    t.kind = Target::Kind::kCubin;
    rest = text.substr(3);
  } else if (text.starts_with("compute_")) {
    t.kind = Target::Kind::kPtx;
    rest = text.substr(8);
  }
  if (!rest.empty() && rest.back() == 'a') {
    t.arch_specific = true;
    rest.remove_suffix(1);
  }
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), t.arch);
  if (rest.empty() || ec != std::errc() || end != rest.data() + rest.size() || t.arch < 50 ||
      t.arch > 999) {
    return absl::InvalidArgumentError(fmt::format(
        "arch: '{}' is not a target; expected sm_XY (CUBIN, e.g. sm_90, sm_100), sm_XYa "
        "(arch-specific, e.g. sm_90a) or compute_XY (PTX)",
        text));
  }
  return t;
}

absl::Status CheckNvrtcSupports(const Target& target, const std::vector<int>& supported_archs) {
  if (std::find(supported_archs.begin(), supported_archs.end(), target.arch) !=
      supported_archs.end()) {
    return absl::OkStatus();
  }
  std::string list;
  for (int a : supported_archs) list += fmt::format(" sm_{}", a);
  return absl::FailedPreconditionError(fmt::format(
      "arch: this NVRTC cannot compile for {} (it supports:{}); fix: install a CUDA toolkit whose "
      "NVRTC supports it (Blackwell sm_100/sm_103/sm_120 need CUDA 12.8 or newer)",
      target.ToString(), list));
}

absl::StatusOr<Target> SelectTargetForDevice(int cc, const std::vector<int>& supported_archs,
                                             int nvrtc_version, int driver_version) {
  if (std::find(supported_archs.begin(), supported_archs.end(), cc) != supported_archs.end()) {
    return Target{Target::Kind::kCubin, cc, false};
  }
  int best = 0;
  for (int a : supported_archs) {
    // PTX for a lower arch of the same major runs; Blackwell (10.x, 12.x) also runs compute_9x PTX.
    if (a < cc && a > best) best = a;
  }
  if (best == 0) {
    return absl::FailedPreconditionError(fmt::format(
        "no target: NVRTC supports no arch at or below sm_{} (the GPU); fix: install a CUDA "
        "toolkit that supports this GPU",
        cc));
  }
  if (driver_version < nvrtc_version) {
    return absl::FailedPreconditionError(fmt::format(
        "no target: NVRTC {}.{} cannot build CUBIN for sm_{}, and its PTX would be refused by the "
        "older driver (CUDA {}.{}) with CUDA_ERROR_UNSUPPORTED_PTX_VERSION; fix: install a CUDA "
        "toolkit whose NVRTC supports sm_{}, or a driver for CUDA {}.{} or newer",
        nvrtc_version / 1000, nvrtc_version % 1000 / 10, cc, driver_version / 1000,
        driver_version % 1000 / 10, cc, nvrtc_version / 1000, nvrtc_version % 1000 / 10));
  }
  return Target{Target::Kind::kPtx, best, false};
}

std::vector<Target> DefaultPrebuildTargets() {
  return {Target{Target::Kind::kCubin, 90, false}, Target{Target::Kind::kCubin, 100, false}};
}

}  // namespace kjit::jit
