#include "jit/source.h"

#include <fmt/format.h>

#include "jit/embedded_templates.h"

namespace kjit::jit {

absl::StatusOr<Source> RenderSource(std::string name, const std::vector<std::string>& header_names,
                                    std::vector<std::string> name_expressions,
                                    std::map<std::string, std::string> params) {
  if (header_names.empty() || name_expressions.empty()) {
    return absl::InvalidArgumentError("RenderSource: needs at least one header and one kernel");
  }
  Source src;
  src.name = std::move(name);
  for (const std::string& h : header_names) {
    const std::string* text = FindEmbeddedTemplate(h);
    if (text == nullptr) {
      return absl::NotFoundError(fmt::format("template '{}' is not embedded in this build", h));
    }
    src.headers.emplace_back(h, *text);
  }
  src.text = fmt::format("// kjit: {} ({})\n#include \"{}\"\n", src.name, FormatParams(params),
                         header_names.back());
  // NVRTC instantiates each registered name expression itself; the stub only records them so
  // that the program text (and so the cache key) names every kernel it holds.
  for (const std::string& expr : name_expressions) src.text += fmt::format("// kernel: {}\n", expr);
  src.name_expressions = std::move(name_expressions);
  src.params = std::move(params);
  return src;
}

std::string FormatParams(const std::map<std::string, std::string>& params) {
  std::string out;
  for (const auto& [k, v] : params) {
    if (!out.empty()) out += ' ';
    out += k + "=" + v;
  }
  return out;
}

}  // namespace kjit::jit
