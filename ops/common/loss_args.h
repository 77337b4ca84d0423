// The launch checks every loss op makes the same way (cross-entropy, its sharded variant, the
// lm_head op): the per-row views of the loss and its optional outputs, and the class weights,
// against the op's loss options.
//
//   KJIT_RETURN_IF_ERROR(ops::CheckLossRowViews(spec.loss, rows,
//                                               {.targets = a.targets, .loss = a.loss, ...}));
//   KJIT_RETURN_IF_ERROR(ops::CheckClassWeight(a.class_weight, spec.loss.class_weight_dtype,
//                                              spec.vocab));
#pragma once

#include <cstdint>
#include <optional>

#include "kjit/loss_options.h"
#include "kjit/tensor.h"

namespace kjit::ops {

// A launch's views with one element per row (the loss and lse one value for sum and mean);
// empty optional views are absent.
struct LossRowViews {
  IndexView targets;
  TensorView loss;
  TensorView lse;
  IndexView argmax;
  TensorView entropy;
  TensorView target_logprob;
};

// Checked in this order for `rows` rows: targets, loss, lse (when given), argmax and entropy
// (present exactly when the options ask for them), target_logprob (when given). The first problem
// as InvalidArgument naming its view.
absl::Status CheckLossRowViews(const LossOptions& loss, int64_t rows, const LossRowViews& views);

// A launch's class_weight against the op's class_weight_dtype: a [vocab] vector of it when that
// is set, else absent.
absl::Status CheckClassWeight(const TensorView& class_weight, const std::optional<DType>& dtype,
                              int64_t vocab);

// The loss, grad_output and lse shapes depend on the reduction: per row for none, else one value.
int64_t PerRowOrOne(const LossOptions& loss, int64_t rows);

}  // namespace kjit::ops
