// The launch arguments cross-entropy shares with its sharded variant: the checks of the views a
// forward (and forward+backward) takes, and the row kernels' parameters they fill. The sharded op
// checks its shard of the logits (cols = the shard's width) with the spec of the whole loss.
//
//   KJIT_RETURN_IF_ERROR(ops::CheckLossArgs(spec, spec.vocab, a, WorkspaceBytes(a.logits.rows)));
//   CrossEntropyRowParams p = ops::RowParams(spec, a.logits, a.targets, a.grad, a.grad_output,
//                                            a.class_weight, a.workspace);
#pragma once

#include <cstdint>
#include <optional>

#include "kjit/cross_entropy.h"
#include "ops/common/loss_args.h"
#include "templates/cross_entropy_params.h"

namespace kjit::ops {

// A CrossEntropyArgs, or a ShardedCrossEntropyArgs (which has no argmax, entropy or
// target_logprob), whose logits have `cols` columns (the vocab, or the shard's width), checked
// against `spec`: the first problem as InvalidArgument naming its view. Shapes and dtypes, the
// outputs the spec asks for, grad_output only with grad, the workspace (at least
// `workspace_needed` bytes), and no output overlapping another view (grad may be the logits
// themselves: in place). Empty optional views are absent.
template <typename Args>
absl::Status CheckLossArgs(const CrossEntropySpec& spec, int64_t cols, const Args& args,
                           int64_t workspace_needed);

// The gradient is the logits themselves (same data and stride: in place) or shares no element.
absl::Status CheckGradAgainstLogits(const TensorView& grad, const TensorView& logits);

// ops::PerRowOrOne of the spec's loss options (ops/common/loss_args.h).
int64_t PerRowOrOne(const CrossEntropySpec& spec, int64_t rows);

// The row kernels' parameters every launch sets; the outputs are left null.
CrossEntropyRowParams RowParams(const CrossEntropySpec& spec, const TensorView& logits,
                                const IndexView& targets, const TensorView& grad,
                                const TensorView& grad_output, const TensorView& class_weight,
                                void* workspace);

}  // namespace kjit::ops
