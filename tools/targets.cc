#include "tools/targets.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <system_error>

#include <fmt/format.h>

#include <absl/strings/ascii.h>
#include <absl/strings/str_split.h>

#include "jit/dtype.h"
#include "jit/nvrtc.h"
#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "jit/target.h"
#include "ops/common/json_fields.h"
#include "tools/commands.h"

namespace kjit::tools {

namespace {

std::string& ToolName() {
  static std::string name = "kjit";
  return name;
}

// A validator's answer: "" when OK, else the message without the field it names (CLI11 puts the
// flag there: "--dtype: 'bf17' is not supported; ...").
std::string Problem(const absl::Status& status) {
  return status.ok() ? "" : std::string(ops::WithoutField(ToStd(status.message())));
}

// --arch's list of targets, each parsed.
absl::StatusOr<std::vector<jit::Target>> ParseTargets(const std::string& arch) {
  const std::vector<std::string> pieces = absl::StrSplit(arch, ',', absl::SkipEmpty());
  if (pieces.empty()) {
    return absl::InvalidArgumentError(
        "arch: no target; expected auto or a list such as sm_90,sm_100");
  }
  std::vector<jit::Target> targets;
  for (const std::string& piece : pieces) {
    KJIT_ASSIGN_OR_RETURN(const jit::Target t, jit::ParseTarget(piece));
    targets.push_back(t);
  }
  return targets;
}

// --arch's targets: each must parse, and NVRTC (when it loads) must support each.
absl::Status CheckTargets(const std::string& arch) {
  KJIT_ASSIGN_OR_RETURN(const std::vector<jit::Target> targets, ParseTargets(arch));
  absl::StatusOr<const jit::Nvrtc*> nvrtc = jit::Nvrtc::Get();
  if (!nvrtc.ok()) return absl::OkStatus();  // the compile says what is wrong with NVRTC
  for (const jit::Target& t : targets) {
    KJIT_RETURN_IF_ERROR(jit::CheckNvrtcSupports(t, (*nvrtc)->supported_archs()));
  }
  return absl::OkStatus();
}

// CLI11 reads integers with strtoll's base 0, so "032000" was octal 13312, "0x40" hex 64 and " 64"
// 64: an integer on kjit's command lines is decimal, an optional '-' and digits, whose leading
// zeros mean nothing. A transform, so that it runs before the option's range check reads the value.
std::string DecimalInteger(std::string& value) {
  if (value.empty()) return "";  // the check of empty values says so
  const bool negative = value.starts_with('-');
  const std::string_view digits = std::string_view(value).substr(negative ? 1 : 0);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return fmt::format("'{}' is not a decimal integer", value);
  }
  const size_t first = std::min(digits.find_first_not_of('0'), digits.size() - 1);
  value = (negative ? "-" : "") + std::string(digits.substr(first));
  return "";
}

// An empty value means nothing to any option of kjit's, but CLI11 reads "" as 0 for a number and
// as itself for a string (where kjit takes it for "not given"): refuse it for every option that
// takes a value, and any integer but a decimal one, the subcommands' options too, so that no
// option is left out.
void CheckEveryValue(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& value) { return value.empty() ? std::string("must not be empty") : ""; }, "");
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_expected_min() > 0) opt->check(non_empty);
    // Its type's name, before the validators' descriptions ("INT:INT in [1 - 65536]").
    const std::string type = opt->get_type_name().substr(0, opt->get_type_name().find(':'));
    if (type == "INT" || type == "UINT") {
      opt->transform(CLI::Validator(DecimalInteger, ""));
    }
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) {
    CheckEveryValue(*sub);
  }
}

// "kjit: cannot write to standard output: No space left on device" on stderr, through stdio:
// fmt::print would throw if stderr is gone too. `error` is an errno value, 0 when unknown.
int StdoutFailed(int error) {
  const std::string line =
      fmt::format("{}: cannot write to standard output{}{}\n", ToolName(), error != 0 ? ": " : "",
                  error != 0 ? std::strerror(error) : "");
  std::fputs(line.c_str(), stderr);
  return 1;
}

}  // namespace

CLI::Validator DTypeValidator() {
  return CLI::Validator([](std::string& value) { return Problem(ParseDType(value).status()); },
                        "{fp32,fp16,bf16}");
}

CLI::Validator ArchValidator() {
  return CLI::Validator(
      [](std::string& value) { return value == "auto" ? "" : Problem(CheckTargets(value)); },
      "auto|TARGET[,TARGET...]");
}

absl::Status CheckDTypesForArch(
    const std::string& arch, const std::vector<std::pair<std::string, std::string>>& dtype_flags) {
  if (arch == "auto") return absl::OkStatus();
  KJIT_ASSIGN_OR_RETURN(const std::vector<jit::Target> targets, ParseTargets(arch));
  for (const jit::Target& target : targets) {
    for (const auto& [flag, name] : dtype_flags) {
      if (name.empty()) continue;
      KJIT_ASSIGN_OR_RETURN(const DType dtype, ParseDType(name));
      KJIT_RETURN_IF_ERROR(CheckDTypesOnTarget(target, {{flag, dtype}}));
    }
  }
  return absl::OkStatus();
}

void ThrowIfUsageError(const absl::Status& status) {
  if (!status.ok()) throw CLI::ValidationError(std::string(ToStd(status.message())));
}

std::string UsageMessage(const CLI::App* app, const CLI::Error& e) {
  // CLI11 quotes what was typed: a 100 KB argument whole, its escape sequences raw.
  constexpr size_t kMax = 400;
  std::string what = jit::Printable(e.what());
  if (what.size() > kMax) what = fmt::format("{}... ({} bytes)", what.substr(0, kMax), what.size());
  const CLI::Option* help = app->get_help_ptr();
  return fmt::format(
      "{}: {}\n{}", app->get_name(), what,
      help ? fmt::format("Run with {} for more information.\n", help->get_name()) : "");
}

std::optional<int> ParseFlags(CLI::App& app, int argc, const char* const* argv, std::ostream& out,
                              std::ostream& err) {
  CheckEveryValue(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; every real usage error exits 2. CLI11 ends
    // the version with std::endl, whose flush would fail (a full stdout) before Finish could see
    // why: the text is written unflushed, like every other output.
    std::ostringstream text;
    const int code = app.exit(e, text, err) == 0 ? 0 : 2;
    out << text.str();
    return code;
  }
  return std::nullopt;
}

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
      fmt::print(stderr, "{}: no GPU ({}); building for {}\n", ToolName(),
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

void SetToolName(std::string name) { ToolName() = std::move(name); }

int Finish(const ParsedCommandLine& cli) {
  int code = 1;
  try {
    code = cli.exit_code ? *cli.exit_code : cli.run();
  } catch (const std::system_error& e) {
    // fmt::print throws when a write fails (a long output); the tools print to stdout and stderr
    // only, and with stderr gone there is nowhere to say more.
    if (std::ferror(stdout)) return StdoutFailed(e.code().value());
    if (std::ferror(stderr)) return 1;
    throw;
  }
  // What is still buffered (a short output) is written here, or its failure lost at exit.
  errno = 0;
  if (std::fflush(stdout) != 0 || std::ferror(stdout)) return StdoutFailed(errno);
  return code;
}

int Fail(const absl::Status& status) {
  // Messages quote paths and values from outside kjit.
  fmt::print(stderr, "{}: {}\n", ToolName(), jit::PrintableLines(ToStd(status.message())));
  return 1;
}

}  // namespace kjit::tools
