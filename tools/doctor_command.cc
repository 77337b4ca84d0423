// `kjit doctor`: diagnose the driver, NVRTC, GPU targets, the cache and the environment, each
// finding OK / WARN / FAIL with the fix. Exit code 0 when nothing fails, 1 when something does
// (2 for bad usage, as every subcommand). The --json schema is documented in tools/doctor.h.
#include <string>
#include <vector>

#include <absl/strings/str_split.h>
#include <fmt/format.h>

#include "jit/status_helpers.h"
#include "jit/target.h"
#include "tools/commands.h"
#include "tools/doctor.h"
#include "tools/doctor_probe.h"

namespace kjit::tools {

namespace {

struct DoctorFlags {
  bool json = false;
  bool fix_cache = false;
  bool no_launch = false;
  std::string arch;
};

std::vector<std::string> SplitTargets(const std::string& arch) {
  std::vector<std::string> out;
  for (absl::string_view piece : absl::StrSplit(arch, ',', absl::SkipEmpty())) {
    out.emplace_back(piece);
  }
  return out;
}

int RunDoctor(const DoctorFlags& f) {
  ProbeOptions options;
  for (const std::string& t : SplitTargets(f.arch)) {
    // Validated at parse time; normalized here ("sm_90" stays "sm_90").
    options.arch_targets.push_back(jit::ParseTarget(t).value().ToString());
  }
  options.launch = !f.no_launch;
  options.fix_cache = f.fix_cache;
  const DoctorFacts facts = GatherFacts(options);
  const std::vector<Finding> findings = Diagnose(facts);
  if (f.json) {
    fmt::print("{}", FormatJson(findings, facts.kjit_version));
  } else {
    fmt::print("kjit doctor (kjit {})\n{}", facts.kjit_version, FormatText(findings));
  }
  return ExitCodeFor(findings);
}

}  // namespace

Command AddDoctorCommand(CLI::App& app) {
  auto f = std::make_shared<DoctorFlags>();
  CLI::App* cmd = app.add_subcommand(
      "doctor",
      "Diagnose the CUDA driver, NVRTC, GPU targets, the kernel cache and the environment; each "
      "finding is OK, WARN or FAIL with the fix. Exit code 1 when anything fails");
  cmd->add_flag(
      "--json", f->json,
      "Print JSON: {\"schema\": 1, \"kjit\", \"findings\": [{\"check\", \"status\", "
      "\"message\", \"fix\"}], \"summary\": {\"ok\", \"warn\", \"fail\"}, \"exit_code\"}");
  cmd->add_flag("--fix-cache", f->fix_cache,
                "Remove cache entries that cannot be used here (other targets or NVRTC versions) "
                "and corrupt ones, and report how many");
  cmd->add_option("--arch", f->arch,
                  "Also test-compile for these targets, comma-separated (e.g. sm_90,sm_100); "
                  "their cache entries count as in use. Without a GPU and without --arch, sm_90 "
                  "and sm_100 are checked")
      ->check(CLI::Validator(
          [](std::string& value) -> std::string {
            const std::vector<std::string> targets = SplitTargets(value);
            // CLI11 puts the flag's name before what a validator returns.
            if (targets.empty()) return "no target; expected a list such as sm_90,sm_100";
            for (const std::string& t : targets) {
              if (auto parsed = jit::ParseTarget(t); !parsed.ok()) {
                return std::string(ToStd(parsed.status().message()));
              }
            }
            return "";
          },
          "TARGET[,TARGET...]"));
  cmd->add_flag("--no-launch", f->no_launch, "Do not test-launch a kernel on the GPUs");
  return [f] { return RunDoctor(*f); };
}

}  // namespace kjit::tools
