// The loss options (kjit/loss_options.h) as the ops read and write them, once for every
// loss op: the spec JSON's fields and the tuning database's shape words.
//
//   nlohmann::json j = {{"op", "cross_entropy"}, {"vocab", 128256}};
//   LossOptionsToJson(spec.loss, j);  // "target_type", "ignore_index", ..., "z_loss"
//   KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
//   KJIT_ASSIGN_OR_RETURN(spec.loss, LossOptionsFromJson(in));
//   LossTuningWords(spec.loss);  // " softcap smoothing z_loss": appended to "vocab=128256"
//   FlagsOfPart(LossFlags(), &CrossEntropySpec::loss);  // `kjit compile`'s --z-loss, ...
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "kjit/loss_options.h"
#include "ops/common/json_fields.h"
#include "ops/common/spec_flags.h"
#include "ops/common/tuning_shape_words.h"

namespace kjit::ops {

// Adds the options' fields to a spec's JSON object: entropy and class_weight_dtype only when set.
void LossOptionsToJson(const LossOptions& loss, nlohmann::json& j);
// Reads them back (unvalidated: the op's Validate*Spec checks them against its dtype). Reads the
// z-loss coefficient's old name, "lse_square_scale", too.
absl::StatusOr<LossOptions> LossOptionsFromJson(JsonFields& in);

// " softcap smoothing z_loss argmax entropy class_weights", the options that add work per
// element (empty when none), and back: any value that adds the work, since which one does not
// change which configs fit.
std::string LossTuningWords(const LossOptions& loss);
LossOptions LossFromTuningWords(const TuningShapeWords& w, DType dtype);

// The targets' index type from the JSON field target_type ("int32" or "int64"), and the
// --target-type flag (its info, and its value as the index type), for every op that takes targets.
absl::StatusOr<IndexType> TargetTypeFromJson(JsonFields& in);
FlagInfo TargetTypeFlag();
IndexType TargetTypeOf(const FlagValue& v);

// An option's value as a program's params (its cache key) and messages write it: -0 is 0, so that
// the same options never compile twice.
std::string LossValueText(float value);

// `kjit compile`'s flags for the options (--target-type, --reduction, --label-smoothing, --z-loss,
// --softcap, --argmax, --entropy, --class-weights), the same for every loss op.
std::vector<SpecFlag<LossOptions>> LossFlags();
// The --class-weights flag (a dtype, fp32 or the op's) of `command`, with its help there.
SpecFlag<LossOptions> ClassWeightsFlag(FlagCommand command, std::string help);

}  // namespace kjit::ops
