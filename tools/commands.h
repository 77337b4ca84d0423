// The `kjit` subcommands, and the parse step of both command lines. Each Add*Command registers its
// options on the app, with the checks of its flags (validators, and a final_callback for what
// needs several flags) so that CLI11's parse finds every usage error; it returns the function that
// runs it (exit code: 0 success, 1 failure).
//
//   CLI::App app{"kjit"};
//   Command run_compile = AddCompileCommand(app);
//
// main() and the fuzzers (tests/fuzz) call Parse*CommandLine, which parses and checks argv and
// runs nothing; main then runs what it returns.
#pragma once

#include <functional>
#include <optional>
#include <ostream>

#include <CLI/CLI.hpp>

namespace kjit::tools {

using Command = std::function<int()>;

Command AddCompileCommand(CLI::App& app);
Command AddCacheCommand(CLI::App& app);
Command AddBenchCommand(CLI::App& app);
Command AddDoctorCommand(CLI::App& app);

// A command line parsed and its flags checked. `exit_code` is set when parsing ends the program:
// 0 after --help or --version (printed to `out`), 2 after a usage error (printed to `err`);
// otherwise `run` does what the command line asks and returns the exit code.
struct ParsedCommandLine {
  std::optional<int> exit_code;
  Command run;
};
// `kjit`'s (tools/kjit_main.cc) and `kjit-tune`'s (tools/kjit_tune_main.cc, without its --worker
// mode) command lines; argv[0] is the program.
ParsedCommandLine ParseKjitCommandLine(int argc, const char* const* argv, std::ostream& out,
                                       std::ostream& err);
ParsedCommandLine ParseKjitTuneCommandLine(int argc, const char* const* argv, std::ostream& out,
                                           std::ostream& err);

// What main returns for a parsed command line: the exit code parsing ended with, else what `run`
// returns, once everything printed has reached stdout. Output that could not be written (a full
// disk, a closed stdout, a reader gone while SIGPIPE is ignored) is a failure: one line on stderr,
// exit 1.
int Finish(const ParsedCommandLine& cli);

}  // namespace kjit::tools
