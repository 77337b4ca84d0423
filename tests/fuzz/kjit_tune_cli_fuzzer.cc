// libFuzzer target for `kjit-tune`'s command line: ParseKjitTuneCommandLine (tools/commands.h),
// its flags (--spec's JSON included) through the real CLI11 parser and the flag checks, nothing
// run. Input and invariants: tests/fuzz/command_line_fuzz.h.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/command_line_fuzz.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  kjit::fuzz::KeepCommandLinesOffTheMachine();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kjit::fuzz::FuzzCommandLine(data, size, "kjit-tune",
                                     kjit::tools::ParseKjitTuneCommandLine);
}
