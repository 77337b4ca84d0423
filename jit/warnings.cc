#include "jit/warnings.h"

#include <cstdio>
#include <functional>
#include <mutex>
#include <set>
#include <string>

#include <fmt/format.h>

namespace kjit::jit {

void WarnOnceToStderr(std::string_view message) {
  static std::mutex mu;
  static auto* said = new std::set<std::string, std::less<>>();  // never destroyed: used at exit
  std::lock_guard<std::mutex> lock(mu);
  if (said->insert(std::string(message)).second) fmt::print(stderr, "kjit: warning: {}\n", message);
}

}  // namespace kjit::jit
