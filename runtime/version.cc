#include "kjit/version.h"

#include <fmt/format.h>

#include "jit/driver.h"
#include "jit/nvrtc.h"
#include "jit/status_helpers.h"

namespace kjit {

Versions Version() {
  Versions v{.library = KJIT_VERSION};
  if (auto nvrtc = jit::Nvrtc::Get(); nvrtc.ok()) {
    v.nvrtc = (*nvrtc)->version().ToString();
  } else {
    v.nvrtc = fmt::format("none ({})", ToStd(nvrtc.status().message()));
  }
  if (auto cu = jit::Driver::Get(); cu.ok()) {
    v.driver = fmt::format("{}.{}", (*cu)->version() / 1000, (*cu)->version() % 1000 / 10);
  } else {
    // The first line only: the rest is the fix, which `kjit doctor` prints.
    const std::string why(ToStd(cu.status().message()));
    v.driver = fmt::format("none ({})", why.substr(0, why.find('\n')));
  }
  return v;
}

std::string VersionString() { return "kjit " KJIT_VERSION; }

std::string FullVersionString() {
  const Versions v = Version();
  return fmt::format("kjit {} (NVRTC {}, CUDA driver {})", v.library, v.nvrtc, v.driver);
}

}  // namespace kjit
