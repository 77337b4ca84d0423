// Shared by the command-line fuzzers (kjit_cli_fuzzer, kjit_tune_cli_fuzzer): the fuzzer's bytes as
// argv, parsed and checked by the tool's own Parse*CommandLine (tools/commands.h: CLI11 and every
// flag check), and the invariants of that step. Nothing the command line asks for is run.
//
// Input: the arguments after the program's name, separated by NUL bytes, as argv holds them.
// Invariants: no exception escapes the parse; it either ends the program with 0 (--help, --version:
// text on stdout only) or 2 (a usage error: stderr only, starting "<program>: "), or hands back a
// command to run having printed nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "tools/commands.h"

namespace kjit::fuzz {

// Parsing must not reach a GPU, a driver or NVRTC, whatever the machine: the variables point at
// nothing (the --arch check then skips NVRTC's list of targets, and --version says "none").
inline void KeepCommandLinesOffTheMachine() {
  ::setenv("KJIT_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1);
  ::setenv("KJIT_NVRTC_PATH", "/nonexistent/libnvrtc.so", 1);
  ::setenv("KJIT_CACHE_DIR", "/nonexistent/kjit-cache", 1);
}

template <typename Parse>
int FuzzCommandLine(const uint8_t* data, size_t size, const std::string& program, Parse parse) {
  std::vector<std::string> args = {program};
  std::string arg;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      args.push_back(arg);
      arg.clear();
    } else {
      arg += static_cast<char>(data[i]);
    }
  }
  if (size > 0) args.push_back(arg);
  std::vector<const char*> argv;
  for (const std::string& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);

  std::ostringstream out, err;
  const tools::ParsedCommandLine cli = parse(static_cast<int>(args.size()), argv.data(), out, err);
  if (!cli.exit_code) {
    if (!cli.run || !out.str().empty() || !err.str().empty()) std::abort();
  } else if (*cli.exit_code == 0) {
    if (out.str().empty() || !err.str().empty()) std::abort();
  } else if (*cli.exit_code == 2) {
    if (!out.str().empty() || !err.str().starts_with(program + ": ")) std::abort();
  } else {
    std::abort();
  }
  return 0;
}

}  // namespace kjit::fuzz
