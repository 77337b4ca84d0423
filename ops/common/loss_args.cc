#include "ops/common/loss_args.h"

#include "runtime/tensor_checks.h"

namespace kjit::ops {

absl::Status CheckLossRowViews(const LossOptions& loss, int64_t rows, const LossRowViews& v) {
  KJIT_RETURN_IF_ERROR(internal::CheckIndexVector("targets", v.targets, loss.target_type, rows));
  KJIT_RETURN_IF_ERROR(
      internal::CheckMatrix("loss", v.loss, DType::kF32, 1, PerRowOrOne(loss, rows)));
  if (!v.lse.empty())
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("lse", v.lse, DType::kF32, 1, rows));
  if (loss.argmax) {
    KJIT_RETURN_IF_ERROR(internal::CheckIndexVector("argmax", v.argmax, loss.target_type, rows));
  } else if (!v.argmax.empty()) {
    return absl::InvalidArgumentError("argmax: given, but the op was created without argmax");
  }
  if (loss.entropy) {
    KJIT_RETURN_IF_ERROR(internal::CheckMatrix("entropy", v.entropy, DType::kF32, 1, rows));
  } else if (!v.entropy.empty()) {
    return absl::InvalidArgumentError("entropy: given, but the op was created without entropy");
  }
  if (!v.target_logprob.empty()) {
    KJIT_RETURN_IF_ERROR(
        internal::CheckMatrix("target_logprob", v.target_logprob, DType::kF32, 1, rows));
  }
  return absl::OkStatus();
}

absl::Status CheckClassWeight(const TensorView& class_weight, const std::optional<DType>& dtype,
                              int64_t vocab) {
  if (dtype) return internal::CheckMatrix("class_weight", class_weight, *dtype, 1, vocab);
  if (!class_weight.empty()) {
    return absl::InvalidArgumentError(
        "class_weight: given, but the op was created without class weights (set the spec's "
        "class_weight_dtype)");
  }
  return absl::OkStatus();
}

int64_t PerRowOrOne(const LossOptions& loss, int64_t rows) {
  return loss.reduction == Reduction::kNone ? rows : 1;
}

}  // namespace kjit::ops
