// libFuzzer target for `kjit`'s command line: ParseKjitCommandLine (tools/commands.h), every
// subcommand's flags through the real CLI11 parser and the flag checks, nothing run. Input and
// invariants: tests/fuzz/command_line_fuzz.h.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/command_line_fuzz.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kjit::fuzz::KeepCommandLinesOffTheMachine();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kjit::fuzz::FuzzCommandLine(data, size, "kjit", kjit::tools::ParseKjitCommandLine);
}
