// The RL heads' keys in the tuning database and their spec JSON (what `kjit-tune --spec` and the
// tools read); the trait (ops/log_probs/tuning/trait.h) answers the same for the tools. The
// temperature and ignore_index do not change the work, so the shape leaves them out.
//
//   LogProbsTuningShape({.vocab = 151936, .entropy = true});   // "vocab=151936 entropy"
//   LogProbsToJson(spec).dump();   // {"op": "log_probs", "vocab": 151936, "temperature": 0.7, ...}
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kjit/log_probs.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

inline constexpr std::string_view kLogProbsName = "log_probs";

std::string LogProbsTuningOp(const LogProbsSpec& s);     // "log_probs"
std::string LogProbsTuningShape(const LogProbsSpec& s);  // "vocab=N", plus " entropy"
std::optional<LogProbsSpec> LogProbsFromTuningKey(std::string_view op,
                                                  const TuningShapeWords& shape, DType dtype);
// The spec without its config; LogProbsFromJson validates what it reads.
nlohmann::json LogProbsToJson(const LogProbsSpec& s);
absl::StatusOr<LogProbsSpec> LogProbsFromJson(const nlohmann::json& j);

}  // namespace kjit::ops
