// The RMSNorm program: its launch configs' validity for a spec and the rendering of its kernels
// (forward, backward, dw reduce) for the JIT. No GPU needed.
//
//   KJIT_RETURN_IF_ERROR(ValidateRmsNormConfig(spec, config));
//   KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderRmsNorm(spec, config));
#pragma once

#include "jit/source.h"
#include "kjit/rms_norm.h"

namespace kjit::ops {

// InvalidArgument naming the field when `config` cannot run `spec` (a vector that does not divide
// hidden, a row shape the kernels do not take).
absl::Status ValidateRmsNormConfig(const RmsNormSpec& spec, const RmsNormConfig& config);
absl::StatusOr<jit::Source> RenderRmsNorm(const RmsNormSpec& spec, const RmsNormConfig& config);

}  // namespace kjit::ops
