// kjit: compile, cache, benchmark and diagnose kjit kernels from the command line.
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/trace.h"
#include "kjit/version.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

// CLI11 says "A subcommand is required" whatever was typed instead: name the word and the commands.
std::string KjitUsageMessage(const CLI::App* app, const CLI::Error& e) {
  if (!app->get_subcommands().empty() || e.get_name() != "RequiredError") {
    return UsageMessage(app, e);
  }
  std::vector<std::string> names;
  for (const CLI::App* sub : app->get_subcommands({})) names.push_back(sub->get_name());
  const std::vector<std::string> rest = app->remaining();
  std::string what = "a command is required";
  if (!rest.empty()) {
    what = fmt::format("unknown {} {}", rest[0].starts_with("-") ? "option" : "command",
                       jit::Quoted(rest[0]));
  }
  return UsageMessage(
      app, CLI::ValidationError(fmt::format("{}; commands: {}", what, fmt::join(names, ", "))));
}

}  // namespace

ParsedCommandLine ParseKjitCommandLine(int argc, const char* const* argv, std::ostream& out,
                                       std::ostream& err) {
  CLI::App app{"kjit: JIT-specialized fused kernels (RMSNorm, cross-entropy) for LLM fine-tuning",
               "kjit"};
  app.set_version_flag("--version", [] { return kjit::FullVersionString(); });
  app.require_subcommand(1);
  app.failure_message(KjitUsageMessage);
  auto trace = std::make_shared<std::string>();
  app.add_option(
         "--trace", *trace,
         "Write a Chrome trace (compiles, cache hits, loads) to FILE at exit; as KJIT_TRACE")
      ->type_name("FILE");
  // Registered in the order `kjit --help` and the unknown-command message list them.
  std::map<std::string, Command> commands;
  commands["doctor"] = AddDoctorCommand(app);
  commands["compile"] = AddCompileCommand(app);
  commands["cache"] = AddCacheCommand(app);
  commands["bench"] = AddBenchCommand(app);
  if (std::optional<int> code = ParseFlags(app, argc, argv, out, err)) return {.exit_code = code};
  Command command = commands.at(app.get_subcommands().front()->get_name());
  return {.run = [trace, command] {
    if (!trace->empty()) jit::StartTraceFile(*trace);
    return command();
  }};
}

}  // namespace kjit::tools

// Left out of the CLI fuzzer (tests/fuzz), which links this file for ParseKjitCommandLine and has
// libFuzzer's main.
#ifndef KJIT_CLI_NO_MAIN
int main(int argc, char** argv) {
  return kjit::tools::Finish(kjit::tools::ParseKjitCommandLine(argc, argv, std::cout, std::cerr));
}
#endif
