// The lm_head op's launch checks, in the order Forward and ForwardBackward make them: the views
// against the spec first, then (once the rows' config has given the workspace layout) the
// workspace and the views' overlaps. The first problem as InvalidArgument naming its view.
//
//   KJIT_RETURN_IF_ERROR(ops::CheckLinearCrossEntropyArgs(spec, a, gradient));
//   const WorkspaceLayout l = LayoutFor(spec, ConfigFor(a.hidden_states.rows), ...);
//   KJIT_RETURN_IF_ERROR(ops::CheckLinearCrossEntropyWorkspace(a, l.total, kAlign));
#pragma once

#include <cstdint>

#include "kjit/linear_cross_entropy.h"

namespace kjit::ops {

// Shapes and dtypes against `spec`, the outputs it asks for, and the gradient views: checked when
// `gradient`, else none may be given (Forward computes no gradient).
absl::Status CheckLinearCrossEntropyArgs(const LinearCrossEntropySpec& spec,
                                         const LinearCrossEntropyArgs& args, bool gradient);

// The workspace (at least `workspace_needed` bytes, `align`-byte aligned), and no output
// overlapping another view.
absl::Status CheckLinearCrossEntropyWorkspace(const LinearCrossEntropyArgs& args,
                                              int64_t workspace_needed, int64_t align);

}  // namespace kjit::ops
