#include "ops/cross_entropy/trait.h"

#include <fmt/format.h>

#include "ops/common/json_fields.h"
#include "ops/cross_entropy/search_space.h"

namespace kjit::ops {

using Trait = OpTrait<CrossEntropySpec>;

std::string Trait::TuningOp(const Spec&) { return std::string(kName); }

std::string Trait::TuningShape(const Spec& s) {
  std::string shape = fmt::format("vocab={}", s.vocab);
  if (s.softcap > 0) shape += " softcap";
  if (s.label_smoothing > 0) shape += " smoothing";
  if (s.lse_square_scale > 0) shape += " z_loss";
  if (s.argmax) shape += " argmax";
  if (s.entropy) shape += " entropy";
  if (s.class_weight_dtype) shape += " class_weights";
  return shape;
}

std::optional<CrossEntropySpec> Trait::FromTuningKey(std::string_view, const TuningShapeWords& w,
                                                     DType dtype) {
  // Any value that adds the work: which one does not change which configs fit.
  return Spec{.vocab = w.Int("vocab"),
              .dtype = dtype,
              .label_smoothing = w.Has("smoothing") ? 0.1f : 0.0f,
              .lse_square_scale = w.Has("z_loss") ? 1e-4f : 0.0f,
              .softcap = w.Has("softcap") ? 30.0f : 0.0f,
              .argmax = w.Has("argmax"),
              .class_weight_dtype = w.Has("class_weights") ? std::optional(dtype) : std::nullopt};
}

nlohmann::json Trait::ToJson(const Spec& s) {
  nlohmann::json j = {{"op", kName},
                      {"vocab", s.vocab},
                      {"dtype", Name(s.dtype)},
                      {"target_type", Name(s.target_type)},
                      {"ignore_index", s.ignore_index},
                      {"reduction", Name(s.reduction)},
                      {"label_smoothing", s.label_smoothing},
                      {"lse_square_scale", s.lse_square_scale},
                      {"softcap", s.softcap},
                      {"argmax", s.argmax}};
  if (s.class_weight_dtype) j["class_weight_dtype"] = Name(*s.class_weight_dtype);
  if (s.entropy) j["entropy"] = true;
  return j;
}

absl::StatusOr<CrossEntropySpec> Trait::FromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  Spec s;
  KJIT_ASSIGN_OR_RETURN(s.vocab, in.Int("vocab"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  KJIT_ASSIGN_OR_RETURN(const std::string targets, in.String("target_type"));
  if (targets != "int32" && targets != "int64") {
    return absl::InvalidArgumentError(
        fmt::format("target_type: \"{}\" is not int32 or int64", targets));
  }
  s.target_type = targets == "int32" ? IndexType::kInt32 : IndexType::kInt64;
  KJIT_ASSIGN_OR_RETURN(s.ignore_index, in.Int("ignore_index"));
  KJIT_ASSIGN_OR_RETURN(const std::string reduction, in.String("reduction"));
  bool known = false;
  for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    if (reduction == Name(r)) s.reduction = r, known = true;
  }
  if (!known) {
    return absl::InvalidArgumentError(
        fmt::format("reduction: \"{}\" is not none, sum or mean", reduction));
  }
  KJIT_ASSIGN_OR_RETURN(s.label_smoothing, in.Float("label_smoothing"));
  KJIT_ASSIGN_OR_RETURN(s.lse_square_scale, in.Float("lse_square_scale"));
  KJIT_ASSIGN_OR_RETURN(s.softcap, in.Float("softcap"));
  KJIT_ASSIGN_OR_RETURN(s.argmax, in.Bool("argmax"));
  if (in.Has("class_weight_dtype")) {
    KJIT_ASSIGN_OR_RETURN(s.class_weight_dtype, in.DTypeOf("class_weight_dtype"));
  }
  if (in.Has("entropy")) {
    KJIT_ASSIGN_OR_RETURN(s.entropy, in.Bool("entropy"));
  }
  KJIT_RETURN_IF_ERROR(in.NoOthers(kName, {"op"}));
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(s));
  return s;
}

std::vector<Candidate<CrossEntropyConfig>> Trait::SearchSpace(const Spec& s,
                                                              const Config& heuristic, int arch) {
  return CrossEntropySearchSpace(s.vocab, heuristic.vec, arch);
}

}  // namespace kjit::ops
