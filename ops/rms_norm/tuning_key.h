// RMSNorm's key in the tuning database and its spec JSON: what a launch looks its tuned configs up
// by and hands the tuner with KJIT_AUTOTUNE; its trait (ops/rms_norm/tuning/trait.h) answers the
// same for the tools.
//
//   RmsNormTuningOp({.hidden = 4096, .fused_residual = true});             // "rms_norm+residual"
//   RmsNormTuningShape({.hidden = 3584, .casting = RmsNormCasting::kGemma});  // "hidden=3584
//   gemma" RmsNormToJson(spec).dump();   // {"op": "rms_norm", "hidden": 4096, ...}, as kjit-tune
//   --spec
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kjit/rms_norm.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

inline constexpr std::string_view kRmsNormName = "rms_norm";

// "rms_norm" or "rms_norm+residual"; "hidden=4096", plus " gemma" or " none" and
// " weight=<dtype>".
std::string RmsNormTuningOp(const RmsNormSpec& s);
std::string RmsNormTuningShape(const RmsNormSpec& s);
// A spec with that op and shape, if any.
std::optional<RmsNormSpec> RmsNormFromTuningKey(std::string_view op, const TuningShapeWords& shape,
                                                DType dtype);
// The spec without its config. The JSON names the casting as Name(RmsNormCasting) does:
// "casting": "llama". RmsNormFromJson validates what it reads.
nlohmann::json RmsNormToJson(const RmsNormSpec& s);
absl::StatusOr<RmsNormSpec> RmsNormFromJson(const nlohmann::json& j);

}  // namespace kjit::ops
