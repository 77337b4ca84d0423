// Source: the rendered program, the first stage of the pipeline (op spec -> Source -> Binary).
//
// The kernels live in real .cuh templates; an op renders only a small stub that includes them and
// names the instantiations it needs as NVRTC name expressions, every specialization a template
// argument. The headers travel with the source, so the cache key covers their text.
//
//   KJIT_ASSIGN_OR_RETURN(Source src, RenderSource(
//       "rms_norm", {"common.cuh", "rms_norm_params.h", "rms_norm.cuh"},
//       {"kjit::rms_norm_forward<kjit::bf16, kjit::bf16, 4096, 256, 1, 8, false, false>"},
//       {{"hidden", "4096"}, {"dtype", "bf16"}}));
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "kjit/status.h"

namespace kjit::jit {

struct Source {
  std::string name;  // program name, e.g. "rms_norm_forward"
  std::string text;  // the stub NVRTC compiles
  std::vector<std::pair<std::string, std::string>> headers;  // (include name, text)
  std::vector<std::string> name_expressions;                 // kernels to instantiate and look up
  std::map<std::string, std::string> params;  // the op's parameters, for errors/metadata
};

// Builds a Source from embedded templates: the stub includes the last header and takes the address
// of each kernel so that NVRTC instantiates it. Fails when a header is not embedded.
absl::StatusOr<Source> RenderSource(std::string name, const std::vector<std::string>& header_names,
                                    std::vector<std::string> name_expressions,
                                    std::map<std::string, std::string> params);

// "hidden=4096 dtype=bf16": the params on one line, for messages.
std::string FormatParams(const std::map<std::string, std::string>& params);

}  // namespace kjit::jit
