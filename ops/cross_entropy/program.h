// The cross-entropy programs: launch configs' validity for a spec and GPU, and the rendering of
// the kernels (count, forward, fused forward+backward, backward, gradient rescale, loss reduce;
// and the sharded op's) for the JIT. No GPU needed.
//
//   KJIT_RETURN_IF_ERROR(ValidateCrossEntropyConfig(spec, config, /*arch=*/90));
//   KJIT_ASSIGN_OR_RETURN(jit::Source src, RenderCrossEntropy(spec, config));
#pragma once

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

absl::StatusOr<jit::Source> RenderShardedCrossEntropy(const ShardedCrossEntropySpec& spec,
                                                      const CrossEntropyConfig& config);
// The config the sharded op uses without spec.config: the streaming heuristic for the shard's
// width.
CrossEntropyConfig DefaultShardedCrossEntropyConfig(int64_t width, int vec);

}  // namespace kjit::ops
