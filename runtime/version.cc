#include "runtime/version.h"

namespace kjit {

std::string VersionString() { return "kjit " KJIT_VERSION; }

}  // namespace kjit
