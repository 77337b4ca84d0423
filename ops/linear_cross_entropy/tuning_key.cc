#include "ops/linear_cross_entropy/tuning_key.h"

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "ops/common/json_fields.h"
#include "ops/common/loss_options.h"

namespace kjit::ops {

std::string LinearCrossEntropyTuningOp(const LinearCrossEntropySpec&) {
  return std::string(kLinearCrossEntropyName);
}

std::string LinearCrossEntropyTuningShape(const LinearCrossEntropySpec& s) {
  std::string shape = fmt::format("vocab={} hidden={}", s.vocab, s.hidden);
  if (s.bias) shape += " bias";
  if (s.weight_grad() != s.dtype) shape += " fp32_grad";
  if (s.weight_grad_accumulation == WeightGradAccumulation::kOutputDtype)
    shape += " output_dtype_acc";
  return shape + LossTuningWords(s.loss);
}

std::optional<LinearCrossEntropySpec> LinearCrossEntropyFromTuningKey(std::string_view,
                                                                      const TuningShapeWords& w,
                                                                      DType dtype) {
  return LinearCrossEntropySpec{
      .vocab = w.Int("vocab"),
      .hidden = w.Int("hidden"),
      .dtype = dtype,
      .weight_grad_dtype = w.Has("fp32_grad") ? std::optional(DType::kF32) : std::nullopt,
      .bias = w.Has("bias"),
      .loss = LossFromTuningWords(w, dtype),
      .weight_grad_accumulation = w.Has("output_dtype_acc") ? WeightGradAccumulation::kOutputDtype
                                                            : WeightGradAccumulation::kFloat32};
}

nlohmann::json LinearCrossEntropyToJson(const LinearCrossEntropySpec& s) {
  nlohmann::json j = {{"op", kLinearCrossEntropyName},
                      {"vocab", s.vocab},
                      {"hidden", s.hidden},
                      {"dtype", Name(s.dtype)},
                      {"bias", s.bias},
                      {"weight_grad_dtype", Name(s.weight_grad())},
                      {"weight_grad_accumulation", Name(s.weight_grad_accumulation)}};
  LossOptionsToJson(s.loss, j);
  return j;
}

absl::StatusOr<LinearCrossEntropySpec> LinearCrossEntropyFromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  LinearCrossEntropySpec s;
  KJIT_ASSIGN_OR_RETURN(s.vocab, in.Int("vocab"));
  KJIT_ASSIGN_OR_RETURN(s.hidden, in.Int("hidden"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  KJIT_ASSIGN_OR_RETURN(s.bias, in.Bool("bias"));
  KJIT_ASSIGN_OR_RETURN(s.weight_grad_dtype, in.DTypeOf("weight_grad_dtype"));
  KJIT_ASSIGN_OR_RETURN(const std::string acc, in.String("weight_grad_accumulation"));
  if (acc != Name(WeightGradAccumulation::kFloat32) &&
      acc != Name(WeightGradAccumulation::kOutputDtype)) {
    return absl::InvalidArgumentError(
        fmt::format("weight_grad_accumulation: {} is not fp32 or output_dtype", jit::Quoted(acc)));
  }
  s.weight_grad_accumulation = acc == Name(WeightGradAccumulation::kFloat32)
                                   ? WeightGradAccumulation::kFloat32
                                   : WeightGradAccumulation::kOutputDtype;
  KJIT_ASSIGN_OR_RETURN(s.loss, LossOptionsFromJson(in));
  KJIT_RETURN_IF_ERROR(in.NoOthers(kLinearCrossEntropyName, {"op"}));
  KJIT_RETURN_IF_ERROR(in.WithGiven(ValidateLinearCrossEntropySpec(s)));
  return s;
}

}  // namespace kjit::ops
