#include "tools/targets.h"

#include <fmt/format.h>

#include <absl/strings/str_split.h>

#include "jit/target.h"

namespace kjit::tools {

absl::StatusOr<std::vector<Runtime>> RuntimesForArch(const std::string& arch, bool use_gpu) {
  std::vector<Runtime> out;
  if (arch == "auto") {
    if (use_gpu) {
      auto gpu = Runtime::Create();
      if (gpu.ok()) {
        out.push_back(std::move(*gpu));
        return out;
      }
      std::string targets;
      for (const jit::Target& t : jit::DefaultPrebuildTargets()) {
        targets += (targets.empty() ? "" : ", ") + t.ToString();
      }
      fmt::print(stderr, "kjit: no GPU ({}); building for {}\n",
                 ToStd(gpu.status().message()).substr(0, ToStd(gpu.status().message()).find('\n')),
                 targets);
    }
    for (const jit::Target& t : jit::DefaultPrebuildTargets()) {
      KJIT_ASSIGN_OR_RETURN(Runtime rt,
                            Runtime::Create({.target = t.ToString(), .compile_only = true}));
      out.push_back(std::move(rt));
    }
    return out;
  }
  for (absl::string_view piece : absl::StrSplit(arch, ',', absl::SkipEmpty())) {
    KJIT_ASSIGN_OR_RETURN(Runtime rt,
                          Runtime::Create({.target = std::string(piece), .compile_only = true}));
    out.push_back(std::move(rt));
  }
  if (out.empty()) return absl::InvalidArgumentError("--arch: empty list");
  return out;
}

absl::StatusOr<Runtime> RuntimeOnDevice(int ordinal) {
  auto rt = Runtime::Create({.device = ordinal});
  if (!rt.ok()) {
    return absl::Status(rt.status().code(),
                        fmt::format("--device {}: {}", ordinal, ToStd(rt.status().message())));
  }
  return rt;
}

int Fail(const absl::Status& status) {
  fmt::print(stderr, "kjit: {}\n", ToStd(status.message()));
  return 1;
}

}  // namespace kjit::tools
