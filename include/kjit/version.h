// kjit's version and the versions of what it found at run time, for --version and bug reports.
//
//   fmt::print("{}\n", kjit::VersionString());   // "kjit 0.1.0"
//   kjit::Versions v = kjit::Version();          // v.nvrtc == "13.0", v.driver == "13.0" or
//                                                // "none (no CUDA driver: ...)"
#pragma once

#include <string>

namespace kjit {

struct Versions {
  std::string library;  // "0.1.0"
  std::string nvrtc;    // "13.0", or "none (why)"
  std::string driver;   // the CUDA version the driver supports, "13.0", or "none (why)"
};
Versions Version();

std::string VersionString();
// VersionString() with NVRTC's and the driver's: "kjit 0.1.0 (NVRTC 13.0, CUDA driver 13.0)".
std::string FullVersionString();

}  // namespace kjit
