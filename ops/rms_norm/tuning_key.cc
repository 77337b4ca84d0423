#include "ops/rms_norm/tuning_key.h"

#include <fmt/format.h>

#include "jit/status_helpers.h"
#include "ops/common/json_fields.h"
#include "ops/rms_norm/config.h"

namespace kjit::ops {

std::string RmsNormTuningOp(const RmsNormSpec& s) {
  return s.fused_residual ? "rms_norm+residual" : "rms_norm";
}

std::string RmsNormTuningShape(const RmsNormSpec& s) {
  std::string shape = fmt::format("hidden={}", s.hidden);
  if (s.casting != RmsNormCasting::kLlama) shape += fmt::format(" {}", Name(s.casting));
  if (s.weight_dtype && *s.weight_dtype != s.dtype) {
    shape += fmt::format(" weight={}", Name(*s.weight_dtype));
  }
  return shape;
}

std::optional<RmsNormSpec> RmsNormFromTuningKey(std::string_view op, const TuningShapeWords& w,
                                                DType dtype) {
  RmsNormSpec s{
      .hidden = w.Int("hidden"), .dtype = dtype, .fused_residual = op == "rms_norm+residual"};
  for (RmsNormCasting c : {RmsNormCasting::kGemma, RmsNormCasting::kNone}) {
    if (w.Has(Name(c))) s.casting = c;
  }
  if (auto weight = w.values.find("weight"); weight != w.values.end()) {
    absl::StatusOr<DType> t = ParseDType(weight->second);
    if (!t.ok()) return std::nullopt;
    s.weight_dtype = *t;
  }
  return s;
}

nlohmann::json RmsNormToJson(const RmsNormSpec& s) {
  nlohmann::json j = {{"op", kRmsNormName},
                      {"hidden", s.hidden},
                      {"dtype", Name(s.dtype)},
                      {"eps", s.eps},
                      {"weight_offset", s.weight_offset},
                      {"casting", Name(s.casting)},
                      {"fused_residual", s.fused_residual}};
  if (s.weight_dtype) j["weight_dtype"] = Name(*s.weight_dtype);
  return j;
}

absl::StatusOr<RmsNormSpec> RmsNormFromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  RmsNormSpec s;
  KJIT_ASSIGN_OR_RETURN(s.hidden, in.Int("hidden"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  if (in.Has("weight_dtype")) {
    KJIT_ASSIGN_OR_RETURN(s.weight_dtype, in.DTypeOf("weight_dtype"));
  }
  KJIT_ASSIGN_OR_RETURN(s.eps, in.Float("eps"));
  KJIT_ASSIGN_OR_RETURN(s.weight_offset, in.Float("weight_offset"));
  KJIT_ASSIGN_OR_RETURN(const std::string casting, in.String("casting"));
  KJIT_ASSIGN_OR_RETURN(s.casting, ParseRmsNormCasting(casting));
  KJIT_ASSIGN_OR_RETURN(s.fused_residual, in.Bool("fused_residual"));
  KJIT_RETURN_IF_ERROR(in.NoOthers(kRmsNormName, {"op"}));
  KJIT_RETURN_IF_ERROR(in.WithGiven(ValidateRmsNormSpec(s)));
  return s;
}

}  // namespace kjit::ops

namespace kjit {

std::string ToJson(const RmsNormSpec& spec) { return ops::RmsNormToJson(spec).dump(); }

absl::StatusOr<RmsNormSpec> RmsNormSpecFromJson(std::string_view json) {
  KJIT_ASSIGN_OR_RETURN(const nlohmann::json j, ops::ParseSpecJson(json));
  return ops::RmsNormFromJson(j);
}

}  // namespace kjit
