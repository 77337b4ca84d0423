// kjit's version, for --version and bug reports.
//
//   fmt::print("{}\n", kjit::VersionString());   // "kjit 0.1.0"
#pragma once

#include <string>

namespace kjit {

std::string VersionString();

}  // namespace kjit
