// The cross-entropy programs: launch configs' validity for a spec and GPU, and the rendering of
// the kernels (count, forward, fused forward+backward, backward, gradient rescale, loss reduce;
// and the sharded op's) for the JIT. No GPU needed.
//
//   KJIT_RETURN_IF_ERROR(ValidateCrossEntropyConfig(spec, config, /*arch=*/90));
//   KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderCrossEntropy(spec, config));
#pragma once

#include <optional>
#include <string>

#include "jit/source.h"
#include "kjit/cross_entropy.h"
#include "kjit/sharded_cross_entropy.h"

namespace kjit::ops {

// InvalidArgument naming the field when `config` cannot run `spec` on GPUs of compute capability
// `arch`; arch 0 (not known yet) checks a staged config as for sm_90.
absl::Status ValidateCrossEntropyConfig(const CrossEntropySpec& spec,
                                        const CrossEntropyConfig& config, int arch);
absl::StatusOr<jit::Source> RenderCrossEntropy(const CrossEntropySpec& spec,
                                               const CrossEntropyConfig& config);

// The count kernel of a spec's program, with `threads` threads (the sharded op's counts over the
// whole vocab with the same kernel).
std::string CrossEntropyCountExpr(const CrossEntropySpec& spec, int threads);

// A launch's class_weight against the op's class_weight_dtype: a [vocab] vector of it when that
// is set, else absent.
absl::Status CheckClassWeight(const TensorView& class_weight, const std::optional<DType>& dtype,
                              int64_t vocab);

absl::StatusOr<jit::Source> RenderShardedCrossEntropy(const ShardedCrossEntropySpec& spec,
                                                      const CrossEntropyConfig& config);
// The config the sharded op uses without spec.config: the streaming heuristic for the shard's
// width.
CrossEntropyConfig DefaultShardedCrossEntropyConfig(int64_t width, int vec);

}  // namespace kjit::ops
