#include "ops/log_probs/tuning_key.h"

#include <fmt/format.h>

#include "jit/status_helpers.h"
#include "ops/common/json_fields.h"
#include "ops/common/loss_options.h"

namespace kjit::ops {

std::string LogProbsTuningOp(const LogProbsSpec&) { return std::string(kLogProbsName); }

std::string LogProbsTuningShape(const LogProbsSpec& s) {
  return fmt::format("vocab={}{}", s.vocab, s.entropy ? " entropy" : "");
}

std::optional<LogProbsSpec> LogProbsFromTuningKey(std::string_view, const TuningShapeWords& w,
                                                  DType dtype) {
  return LogProbsSpec{.vocab = w.Int("vocab"), .dtype = dtype, .entropy = w.Has("entropy")};
}

nlohmann::json LogProbsToJson(const LogProbsSpec& s) {
  return {{"op", kLogProbsName},
          {"vocab", s.vocab},
          {"dtype", Name(s.dtype)},
          {"target_type", Name(s.target_type)},
          {"ignore_index", s.ignore_index},
          {"temperature", s.temperature},
          {"entropy", s.entropy}};
}

absl::StatusOr<LogProbsSpec> LogProbsFromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  LogProbsSpec s;
  KJIT_ASSIGN_OR_RETURN(s.vocab, in.Int("vocab"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  KJIT_ASSIGN_OR_RETURN(s.target_type, TargetTypeFromJson(in));
  KJIT_ASSIGN_OR_RETURN(s.ignore_index, in.Int("ignore_index"));
  KJIT_ASSIGN_OR_RETURN(s.temperature, in.Float("temperature"));
  KJIT_ASSIGN_OR_RETURN(s.entropy, in.Bool("entropy"));
  KJIT_RETURN_IF_ERROR(in.NoOthers(kLogProbsName, {"op"}));
  KJIT_RETURN_IF_ERROR(in.WithGiven(ValidateLogProbsSpec(s)));
  return s;
}

}  // namespace kjit::ops
