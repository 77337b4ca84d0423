#include "ops/linear_cross_entropy/trait.h"

#include <fmt/format.h>

#include "ops/common/json_fields.h"
#include "ops/cross_entropy/trait.h"

namespace kjit::ops {

using Trait = OpTrait<LinearCrossEntropySpec>;

std::string Trait::TuningShape(const Spec& s) {
  std::string shape = fmt::format("vocab={} hidden={}", s.vocab, s.hidden);
  if (s.bias) shape += " bias";
  if (s.weight_grad() != s.dtype) shape += " fp32_grad";
  if (s.weight_grad_accumulation == WeightGradAccumulation::kOutputDtype)
    shape += " output_dtype_acc";
  // The loss's options, as the cross-entropy's shape names them ("vocab=V softcap ...").
  const std::string loss = OpTrait<CrossEntropySpec>::TuningShape(s.ChunkLoss());
  return shape + loss.substr(loss.find(' ') == std::string::npos ? loss.size() : loss.find(' '));
}

std::optional<LinearCrossEntropySpec> Trait::FromTuningKey(std::string_view op,
                                                           const TuningShapeWords& w, DType dtype) {
  const std::optional<CrossEntropySpec> loss =
      OpTrait<CrossEntropySpec>::FromTuningKey(op, w, dtype);
  if (!loss) return std::nullopt;
  return Spec{.vocab = w.Int("vocab"),
              .hidden = w.Int("hidden"),
              .dtype = dtype,
              .weight_grad_dtype = w.Has("fp32_grad") ? std::optional(DType::kF32) : std::nullopt,
              .bias = w.Has("bias"),
              .label_smoothing = loss->label_smoothing,
              .lse_square_scale = loss->lse_square_scale,
              .softcap = loss->softcap,
              .argmax = loss->argmax,
              .weight_grad_accumulation = w.Has("output_dtype_acc")
                                              ? WeightGradAccumulation::kOutputDtype
                                              : WeightGradAccumulation::kFloat32};
}

nlohmann::json Trait::ToJson(const Spec& s) {
  nlohmann::json j = OpTrait<CrossEntropySpec>::ToJson(s.ChunkLoss());
  j["op"] = kName;
  j["reduction"] = Name(s.reduction);
  j["hidden"] = s.hidden;
  j["bias"] = s.bias;
  j["weight_grad_dtype"] = Name(s.weight_grad());
  j["weight_grad_accumulation"] = Name(s.weight_grad_accumulation);
  return j;
}

absl::StatusOr<LinearCrossEntropySpec> Trait::FromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  Spec s;
  KJIT_ASSIGN_OR_RETURN(s.hidden, in.Int("hidden"));
  KJIT_ASSIGN_OR_RETURN(s.bias, in.Bool("bias"));
  KJIT_ASSIGN_OR_RETURN(s.weight_grad_dtype, in.DTypeOf("weight_grad_dtype"));
  KJIT_ASSIGN_OR_RETURN(const std::string acc, in.String("weight_grad_accumulation"));
  if (acc != Name(WeightGradAccumulation::kFloat32) &&
      acc != Name(WeightGradAccumulation::kOutputDtype)) {
    return absl::InvalidArgumentError(
        fmt::format("weight_grad_accumulation: \"{}\" is not fp32 or output_dtype", acc));
  }
  s.weight_grad_accumulation = acc == Name(WeightGradAccumulation::kFloat32)
                                   ? WeightGradAccumulation::kFloat32
                                   : WeightGradAccumulation::kOutputDtype;
  // The loss's fields, as the cross-entropy reads them (its reduction may be any of three).
  nlohmann::json loss = j;
  for (const char* k : {"hidden", "bias", "weight_grad_dtype", "weight_grad_accumulation"}) {
    loss.erase(k);
  }
  loss["op"] = OpTrait<CrossEntropySpec>::kName;
  KJIT_ASSIGN_OR_RETURN(const CrossEntropySpec ce, OpTrait<CrossEntropySpec>::FromJson(loss));
  s.vocab = ce.vocab;
  s.dtype = ce.dtype;
  s.target_type = ce.target_type;
  s.ignore_index = ce.ignore_index;
  s.reduction = ce.reduction;
  s.label_smoothing = ce.label_smoothing;
  s.lse_square_scale = ce.lse_square_scale;
  s.softcap = ce.softcap;
  s.argmax = ce.argmax;
  s.entropy = ce.entropy;
  s.class_weight_dtype = ce.class_weight_dtype;
  KJIT_RETURN_IF_ERROR(ValidateLinearCrossEntropySpec(s));
  return s;
}

}  // namespace kjit::ops
