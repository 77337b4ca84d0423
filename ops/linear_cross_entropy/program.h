// The fused linear + cross-entropy op's own kernels (the batch's target count, the gradient's
// scale, the loss reduce over chunks, the fp32 accumulators' final rounding) rendered for the JIT.
// No GPU needed. The chunks' loss is kjit::CrossEntropy's program; the GEMMs are cuBLASLt's.
//
//   KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderLinearCrossEntropy(spec));
#pragma once

#include "jit/source.h"
#include "kjit/linear_cross_entropy.h"

namespace kjit::ops {

absl::StatusOr<jit::Source> RenderLinearCrossEntropy(const LinearCrossEntropySpec& spec);
// The kernels of LinearCrossEntropy::RescaleGradients, a program of their own that only that call
// loads: for the dtype's gradients, then (when it differs) weight_grad()'s, each for scalar and
// 4-wide vectors.
absl::StatusOr<jit::Source> RenderLinearCrossEntropyRescale(const LinearCrossEntropySpec& spec);

}  // namespace kjit::ops
