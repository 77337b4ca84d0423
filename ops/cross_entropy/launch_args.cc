#include "ops/cross_entropy/launch_args.h"

#include <type_traits>

#include <fmt/format.h>

#include "kjit/sharded_cross_entropy.h"
#include "runtime/tensor_checks.h"

namespace kjit::ops {

template <typename Args>
absl::Status CheckLossArgs(const CrossEntropySpec& s, int64_t cols, const Args& a,
                           int64_t workspace_needed) {
  // The outputs only the unsharded op has, absent for the sharded one.
  IndexView argmax;
  TensorView entropy, target_logprob;
  if constexpr (std::is_same_v<Args, CrossEntropyArgs>) {
    argmax = a.argmax;
    entropy = a.entropy;
    target_logprob = a.target_logprob;
  }
  KJIT_RETURN_IF_ERROR(
      internal::CheckMatrix("logits", a.logits, s.dtype, internal::kAnyRows, cols));
  const int64_t rows = a.logits.rows;
  KJIT_RETURN_IF_ERROR(CheckLossRowViews(s.loss, rows,
                                         {.targets = a.targets,
                                          .loss = a.loss,
                                          .lse = a.lse,
                                          .argmax = argmax,
                                          .entropy = entropy,
                                          .target_logprob = target_logprob}));
  if (!a.grad.empty()) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("grad", a.grad, s.dtype, rows, cols));
    KJIT_RETURN_IF_ERROR(CheckGradAgainstLogits(a.grad, a.logits));
  }
  if (!a.grad_output.empty()) {
    if (a.grad.empty()) return absl::InvalidArgumentError("grad_output: given without grad");
    KJIT_RETURN_IF_ERROR(
        internal::CheckMatrix("grad_output", a.grad_output, DType::kF32, 1, PerRowOrOne(s, rows)));
  }
  KJIT_RETURN_IF_ERROR(CheckClassWeight(a.class_weight, s.loss.class_weight_dtype, s.vocab));
  KJIT_RETURN_IF_ERROR(internal::CheckWorkspace(a.workspace, a.workspace_bytes, workspace_needed,
                                                "WorkspaceBytes(rows)"));
  // grad against logits was checked above: in place is allowed, and strided views may interleave.
  return internal::CheckDisjoint({{"loss", a.loss},
                                  {"lse", a.lse},
                                  {"argmax", internal::BytesOf(argmax)},
                                  {"entropy", entropy},
                                  {"target_logprob", target_logprob},
                                  {"grad", a.grad},
                                  {"workspace", internal::BytesOf(a.workspace, workspace_needed)}},
                                 {{"logits", a.logits},
                                  {"targets", internal::BytesOf(a.targets)},
                                  {"grad_output", a.grad_output},
                                  {"class_weight", a.class_weight}},
                                 /*in_place=*/{{"grad", "logits"}});
}
template absl::Status CheckLossArgs(const CrossEntropySpec&, int64_t, const CrossEntropyArgs&,
                                    int64_t);
template absl::Status CheckLossArgs(const CrossEntropySpec&, int64_t,
                                    const ShardedCrossEntropyArgs&, int64_t);

absl::Status CheckGradAgainstLogits(const TensorView& grad, const TensorView& logits) {
  if (grad.data == logits.data && grad.row_stride != logits.row_stride) {
    return absl::InvalidArgumentError(fmt::format(
        "grad: aliases logits with row_stride {} instead of {} (in place needs the same view)",
        grad.row_stride, logits.row_stride));
  }
  return internal::CheckNoPartialOverlap("grad", grad, "logits", logits);
}

int64_t PerRowOrOne(const CrossEntropySpec& s, int64_t rows) { return PerRowOrOne(s.loss, rows); }

CrossEntropyRowParams RowParams(const CrossEntropySpec& s, const TensorView& logits,
                                const IndexView& targets, const TensorView& grad,
                                const TensorView& grad_output, const TensorView& class_weight,
                                void* workspace) {
  CrossEntropyRowParams p{};
  p.logits = logits.data;
  p.logits_stride = logits.row_stride;
  p.targets = targets.data;
  p.rows = logits.rows;
  p.ignore_index = s.loss.ignore_index;
  p.label_smoothing = s.loss.label_smoothing;
  p.z_loss = s.loss.z_loss;
  p.softcap = s.loss.softcap;
  p.grad_output = static_cast<const float*>(grad_output.data);
  p.counters = static_cast<const CrossEntropyCounters*>(workspace);
  p.grad = grad.data;
  p.grad_stride = grad.row_stride;
  p.class_weight = class_weight.data;
  return p;
}

}  // namespace kjit::ops
