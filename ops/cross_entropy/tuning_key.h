// Cross-entropy's keys in the tuning database and its spec JSON: what a launch looks its tuned
// configs up by and hands the tuner with KJIT_AUTOTUNE; its trait
// (ops/cross_entropy/tuning/trait.h) answers the same for the tools.
//
//   CrossEntropyTuningShape({.vocab = 256000, .loss = {.softcap = 30}});  // "vocab=256000 softcap"
//   CrossEntropyStreamingTuningOp(spec);                                 // "cross_entropy.forward"
//   CrossEntropyToJson(spec).dump();   // {"op": "cross_entropy", "vocab": 128256, ...}
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kjit/cross_entropy.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

inline constexpr std::string_view kCrossEntropyName = "cross_entropy";

// "cross_entropy"; "vocab=128256", plus " softcap", " smoothing", " z_loss", " argmax": the
// options that add work per element.
std::string CrossEntropyTuningOp(const CrossEntropySpec& s);
std::string CrossEntropyTuningShape(const CrossEntropySpec& s);
// "cross_entropy.forward": the config of the streaming launches (forward only, backward from a
// saved lse), tuned apart from the fused forward+backward's.
std::string CrossEntropyStreamingTuningOp(const CrossEntropySpec& s);
// A spec with that op and shape, if any.
std::optional<CrossEntropySpec> CrossEntropyFromTuningKey(std::string_view op,
                                                          const TuningShapeWords& shape,
                                                          DType dtype);
// The spec without its config; CrossEntropyFromJson validates what it reads.
nlohmann::json CrossEntropyToJson(const CrossEntropySpec& s);
absl::StatusOr<CrossEntropySpec> CrossEntropyFromJson(const nlohmann::json& j);

}  // namespace kjit::ops
