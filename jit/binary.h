// Binary: a compiled program, the stage the disk cache stores (Source -> Binary -> LoadedModule).
//
// Holds the CUBIN or PTX bytes plus what loading and diagnosis need: the target, the lowered
// (mangled) name of each kernel, the NVRTC version and options, the op's parameters.
//
//   KJIT_ASSIGN_OR_RETURN(Target sm90, ParseTarget("sm_90"));
//   KJIT_ASSIGN_OR_RETURN(Binary bin, Compile(*nvrtc, source, sm90));      // jit/compiler.h
//   const std::string& mangled = bin.lowered_names.at(source.name_expressions[0]);
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "jit/target.h"

namespace kjit::jit {

struct Binary {
  Target target;
  std::string code;                                  // CUBIN (ELF) or PTX text
  std::map<std::string, std::string> lowered_names;  // name expression -> mangled name
  std::string nvrtc_version;                         // "13.0"
  std::vector<std::string> options;                  // as passed to nvrtcCompileProgram
  std::map<std::string, std::string> params;         // the op's parameters
  std::string program_name;
  int64_t created_unix = 0;  // when it was compiled (seconds)
  std::string log;           // NVRTC's log (warnings), may be empty
  // The disk-cache key it was stored under, as its entry records it (cache_entry.h); empty for a
  // binary fresh from NVRTC.
  std::string key;
};

}  // namespace kjit::jit
