// The `kjit` subcommands. Each Add*Command registers its options on the app and returns the
// function that runs it (exit code: 0 success, 1 failure; CLI11 itself exits 2 on bad usage).
//
//   CLI::App app{"kjit"};
//   auto run_compile = AddCompileCommand(app);
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace kjit::tools {

using Command = std::function<int()>;

Command AddCompileCommand(CLI::App& app);
Command AddCacheCommand(CLI::App& app);
Command AddBenchCommand(CLI::App& app);
Command AddDoctorCommand(CLI::App& app);

}  // namespace kjit::tools
