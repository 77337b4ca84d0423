#include "ops/linear_cross_entropy/launch_args.h"

#include <climits>
#include <utility>

#include <fmt/format.h>

#include "ops/common/loss_args.h"
#include "runtime/tensor_checks.h"

namespace kjit::ops {

absl::Status CheckLinearCrossEntropyArgs(const LinearCrossEntropySpec& s,
                                         const LinearCrossEntropyArgs& a, bool gradient) {
  using internal::CheckMatrix;
  KJIT_RETURN_IF_ERROR(
      CheckMatrix("hidden_states", a.hidden_states, s.dtype, internal::kAnyRows, s.hidden));
  const int64_t rows = a.hidden_states.rows;
  if (rows > INT_MAX) {
    return absl::InvalidArgumentError(
        fmt::format("hidden_states: {} rows exceed the {} a launch handles", rows, INT_MAX));
  }
  KJIT_RETURN_IF_ERROR(CheckMatrix("weight", a.weight, s.dtype, s.vocab, s.hidden));
  if (s.bias) {
    KJIT_RETURN_IF_ERROR(CheckMatrix("bias", a.bias, s.dtype, 1, s.vocab));
  } else if (!a.bias.empty() || !a.d_bias.empty()) {
    return absl::InvalidArgumentError(
        fmt::format("{}: given, but the op was created without a bias (set the spec's bias)",
                    a.bias.empty() ? "d_bias" : "bias"));
  }
  KJIT_RETURN_IF_ERROR(CheckLossRowViews(s.loss, rows,
                                         {.targets = a.targets,
                                          .loss = a.loss,
                                          .lse = a.lse,
                                          .argmax = a.argmax,
                                          .entropy = a.entropy,
                                          .target_logprob = a.target_logprob}));
  KJIT_RETURN_IF_ERROR(CheckClassWeight(a.class_weight, s.loss.class_weight_dtype, s.vocab));
  if (gradient) {
    if (!a.grad_output.empty()) {
      KJIT_RETURN_IF_ERROR(
          CheckMatrix("grad_output", a.grad_output, DType::kF32, 1, PerRowOrOne(s.loss, rows)));
    }
    if (!a.d_hidden.empty())
      KJIT_RETURN_IF_ERROR(CheckMatrix("d_hidden", a.d_hidden, s.dtype, rows, s.hidden));
    if (!a.d_weight.empty())
      KJIT_RETURN_IF_ERROR(CheckMatrix("d_weight", a.d_weight, s.weight_grad(), s.vocab, s.hidden));
    if (!a.d_bias.empty())
      KJIT_RETURN_IF_ERROR(CheckMatrix("d_bias", a.d_bias, s.weight_grad(), 1, s.vocab));
  } else {
    for (const auto& [name, v] :
         {std::pair<const char*, const TensorView*>{"grad_output", &a.grad_output},
          {"d_hidden", &a.d_hidden},
          {"d_weight", &a.d_weight},
          {"d_bias", &a.d_bias}}) {
      if (!v->empty()) {
        return absl::InvalidArgumentError(fmt::format(
            "{}: given to Forward, which computes no gradient; use ForwardBackward", name));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckLinearCrossEntropyWorkspace(const LinearCrossEntropyArgs& a,
                                              int64_t workspace_needed, int64_t align) {
  KJIT_RETURN_IF_ERROR(internal::CheckWorkspace(a.workspace, a.workspace_bytes, workspace_needed,
                                                "WorkspaceBytes(rows)"));
  if (reinterpret_cast<uintptr_t>(a.workspace) % align != 0) {
    return absl::InvalidArgumentError(fmt::format(
        "workspace: must be {}-byte aligned (cuBLASLt's and the chunks' buffers)", align));
  }
  return internal::CheckDisjoint({{"loss", a.loss},
                                  {"lse", a.lse},
                                  {"argmax", internal::BytesOf(a.argmax)},
                                  {"entropy", a.entropy},
                                  {"target_logprob", a.target_logprob},
                                  {"d_hidden", a.d_hidden},
                                  {"d_weight", a.d_weight},
                                  {"d_bias", a.d_bias},
                                  {"workspace", internal::BytesOf(a.workspace, workspace_needed)}},
                                 {{"hidden_states", a.hidden_states},
                                  {"weight", a.weight},
                                  {"bias", a.bias},
                                  {"targets", internal::BytesOf(a.targets)},
                                  {"grad_output", a.grad_output},
                                  {"class_weight", a.class_weight}});
}

}  // namespace kjit::ops
