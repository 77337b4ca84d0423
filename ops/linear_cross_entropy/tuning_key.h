// The fused linear + cross-entropy's key in the tuning database and its spec JSON: what a launch
// looks its tuned configs up by and what the tuner reads back; its trait
// (ops/linear_cross_entropy/tuning/trait.h) answers the same for the tools.
//
//   LinearCrossEntropyTuningShape({.vocab = 128256, .hidden = 4096});  // "vocab=128256
//   hidden=4096" LinearCrossEntropyToJson(spec).dump();   // {"op": "linear_cross_entropy", ...}
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kjit/linear_cross_entropy.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

inline constexpr std::string_view kLinearCrossEntropyName = "linear_cross_entropy";

// "linear_cross_entropy"; "vocab=128256 hidden=4096", plus " bias", " fp32_grad",
// " output_dtype_acc" and the loss's options that add work.
std::string LinearCrossEntropyTuningOp(const LinearCrossEntropySpec& s);
std::string LinearCrossEntropyTuningShape(const LinearCrossEntropySpec& s);
// A spec with that op and shape, if any.
std::optional<LinearCrossEntropySpec> LinearCrossEntropyFromTuningKey(std::string_view op,
                                                                      const TuningShapeWords& shape,
                                                                      DType dtype);
// The spec without its config; LinearCrossEntropyFromJson validates what it reads.
nlohmann::json LinearCrossEntropyToJson(const LinearCrossEntropySpec& s);
absl::StatusOr<LinearCrossEntropySpec> LinearCrossEntropyFromJson(const nlohmann::json& j);

}  // namespace kjit::ops
