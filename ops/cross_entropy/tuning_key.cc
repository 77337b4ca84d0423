#include "ops/cross_entropy/tuning_key.h"

#include <fmt/format.h>

#include "jit/status_helpers.h"
#include "ops/common/json_fields.h"
#include "ops/common/loss_options.h"

namespace kjit::ops {

std::string CrossEntropyTuningOp(const CrossEntropySpec&) { return std::string(kCrossEntropyName); }

std::string CrossEntropyTuningShape(const CrossEntropySpec& s) {
  return fmt::format("vocab={}", s.vocab) + LossTuningWords(s.loss);
}

std::string CrossEntropyStreamingTuningOp(const CrossEntropySpec& s) {
  return CrossEntropyTuningOp(s) + ".forward";
}

std::optional<CrossEntropySpec> CrossEntropyFromTuningKey(std::string_view,
                                                          const TuningShapeWords& w, DType dtype) {
  return CrossEntropySpec{
      .vocab = w.Int("vocab"), .dtype = dtype, .loss = LossFromTuningWords(w, dtype)};
}

nlohmann::json CrossEntropyToJson(const CrossEntropySpec& s) {
  nlohmann::json j = {{"op", kCrossEntropyName}, {"vocab", s.vocab}, {"dtype", Name(s.dtype)}};
  LossOptionsToJson(s.loss, j);
  return j;
}

absl::StatusOr<CrossEntropySpec> CrossEntropyFromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  CrossEntropySpec s;
  KJIT_ASSIGN_OR_RETURN(s.vocab, in.Int("vocab"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  KJIT_ASSIGN_OR_RETURN(s.loss, LossOptionsFromJson(in));
  KJIT_RETURN_IF_ERROR(in.NoOthers(kCrossEntropyName, {"op"}));
  KJIT_RETURN_IF_ERROR(in.WithGiven(ValidateCrossEntropySpec(s)));
  return s;
}

}  // namespace kjit::ops
