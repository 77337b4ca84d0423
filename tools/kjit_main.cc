// kjit: compile, cache, benchmark and diagnose kjit kernels from the command line.
#include <cstdlib>
#include <string>

#include <fmt/format.h>

#include "kjit/version.h"
#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"kjit: JIT-specialized fused kernels (RMSNorm, cross-entropy) for LLM fine-tuning",
               "kjit"};
  app.set_version_flag("--version", [] { return kjit::FullVersionString(); });
  app.require_subcommand(1);
  std::string trace;
  app.add_option(
         "--trace", trace,
         "Write a Chrome trace (compiles, cache hits, loads) to FILE at exit; as KJIT_TRACE")
      ->type_name("FILE");
  kjit::tools::Command compile = kjit::tools::AddCompileCommand(app);
  kjit::tools::Command cache = kjit::tools::AddCacheCommand(app);
  kjit::tools::Command bench = kjit::tools::AddBenchCommand(app);
  kjit::tools::Command doctor = kjit::tools::AddDoctorCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" that exit 0; every real usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Before anything traces: the tracer reads the environment once.
  if (!trace.empty()) ::setenv("KJIT_TRACE", trace.c_str(), 1);
  if (app.got_subcommand("compile")) return compile();
  if (app.got_subcommand("cache")) return cache();
  if (app.got_subcommand("bench")) return bench();
  if (app.got_subcommand("doctor")) return doctor();
  return 2;
}
