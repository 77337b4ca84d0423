// BuildInfo's JSON (kjit/runtime.h, runtime/build_info_json.h).
#include "runtime/build_info_json.h"

#include "jit/json_text.h"

namespace kjit {

nlohmann::json internal::ProgramsJson(const BuildInfo& built) {
  nlohmann::json programs = nlohmann::json::array();
  for (const BuildInfo& p : built.programs) {
    programs.push_back({{"program", p.program},
                        {"key", p.key},
                        {"origin", p.origin},
                        {"path", p.path},
                        {"bytes", p.bytes},
                        {"kernels", p.kernels}});
  }
  return programs;
}

std::string BuildInfo::ToJson() const {
  const nlohmann::json j = {{"key", key},         {"program", program},
                            {"target", target},   {"origin", origin},
                            {"path", path},       {"bytes", bytes},
                            {"nvrtc", nvrtc},     {"params", params},
                            {"kernels", kernels}, {"programs", internal::ProgramsJson(*this)}};
  return jit::JsonText(j);
}

}  // namespace kjit
