#include "ops/common/loss_options.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "jit/printable.h"
#include "jit/status_helpers.h"

namespace kjit {

const char* Name(Reduction r) {
  switch (r) {
    case Reduction::kNone: return "none";
    case Reduction::kSum: return "sum";
    case Reduction::kMean: return "mean";
  }
  return "?";
}

absl::Status ValidateLossOptions(const LossOptions& loss, DType dtype) {
  if (loss.target_type == IndexType::kInt32 &&
      (loss.ignore_index < INT32_MIN || loss.ignore_index > INT32_MAX)) {
    return absl::InvalidArgumentError(
        fmt::format("ignore_index: {} does not fit the int32 targets", loss.ignore_index));
  }
  if (!std::isfinite(loss.label_smoothing) || loss.label_smoothing < 0 ||
      loss.label_smoothing >= 1) {
    return absl::InvalidArgumentError(
        fmt::format("label_smoothing: {} must be in [0, 1)", loss.label_smoothing));
  }
  if (!std::isfinite(loss.z_loss) || loss.z_loss < 0) {
    return absl::InvalidArgumentError(
        fmt::format("z_loss: {} must be finite and not negative", loss.z_loss));
  }
  if (!std::isfinite(loss.softcap) || loss.softcap < 0) {
    return absl::InvalidArgumentError(
        fmt::format("softcap: {} must be 0 (off) or a finite positive cap", loss.softcap));
  }
  if (loss.class_weight_dtype && *loss.class_weight_dtype != DType::kF32 &&
      *loss.class_weight_dtype != dtype) {
    return absl::InvalidArgumentError(
        fmt::format("class_weight_dtype: {} must be fp32 or the logits' dtype ({})",
                    Name(*loss.class_weight_dtype), Name(dtype)));
  }
  return absl::OkStatus();
}

namespace ops {

void LossOptionsToJson(const LossOptions& loss, nlohmann::json& j) {
  // Every field by name: a field added to LossOptions stops the build here until it is written.
  const auto& [target_type, ignore_index, reduction, label_smoothing, z_loss, softcap, argmax,
               entropy, class_weight_dtype] = loss;
  j["target_type"] = Name(target_type);
  j["ignore_index"] = ignore_index;
  j["reduction"] = Name(reduction);
  j["label_smoothing"] = label_smoothing;
  j["z_loss"] = z_loss;
  j["softcap"] = softcap;
  j["argmax"] = argmax;
  if (entropy) j["entropy"] = true;  // absent when off, as specs written before it have it
  if (class_weight_dtype) j["class_weight_dtype"] = Name(*class_weight_dtype);
}

absl::StatusOr<IndexType> TargetTypeFromJson(JsonFields& in) {
  KJIT_ASSIGN_OR_RETURN(const std::string targets, in.String("target_type"));
  if (targets != Name(IndexType::kInt32) && targets != Name(IndexType::kInt64)) {
    return absl::InvalidArgumentError(
        fmt::format("target_type: {} is not int32 or int64", jit::Quoted(targets)));
  }
  return targets == Name(IndexType::kInt32) ? IndexType::kInt32 : IndexType::kInt64;
}

absl::StatusOr<LossOptions> LossOptionsFromJson(JsonFields& in) {
  LossOptions loss;
  KJIT_ASSIGN_OR_RETURN(loss.target_type, TargetTypeFromJson(in));
  KJIT_ASSIGN_OR_RETURN(loss.ignore_index, in.Int("ignore_index"));
  KJIT_ASSIGN_OR_RETURN(const std::string reduction, in.String("reduction"));
  bool known = false;
  for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
    if (reduction == Name(r)) loss.reduction = r, known = true;
  }
  if (!known) {
    return absl::InvalidArgumentError(
        fmt::format("reduction: {} is not none, sum or mean", jit::Quoted(reduction)));
  }
  KJIT_ASSIGN_OR_RETURN(loss.label_smoothing, in.Float("label_smoothing"));
  // Specs written before the options were one struct name the coefficient lse_square_scale.
  const bool old_name = in.Has("lse_square_scale");
  if (old_name && in.Has("z_loss")) {
    return absl::InvalidArgumentError(
        "z_loss: given twice, also as lse_square_scale (its old name)");
  }
  KJIT_ASSIGN_OR_RETURN(loss.z_loss, in.Float(old_name ? "lse_square_scale" : "z_loss"));
  KJIT_ASSIGN_OR_RETURN(loss.softcap, in.Float("softcap"));
  KJIT_ASSIGN_OR_RETURN(loss.argmax, in.Bool("argmax"));
  if (in.Has("entropy")) {
    KJIT_ASSIGN_OR_RETURN(loss.entropy, in.Bool("entropy"));
  }
  if (in.Has("class_weight_dtype")) {
    KJIT_ASSIGN_OR_RETURN(loss.class_weight_dtype, in.DTypeOf("class_weight_dtype"));
  }
  return loss;
}

std::string LossTuningWords(const LossOptions& loss) {
  std::string words;
  if (loss.softcap > 0) words += " softcap";
  if (loss.label_smoothing > 0) words += " smoothing";
  if (loss.z_loss > 0) words += " z_loss";
  if (loss.argmax) words += " argmax";
  if (loss.entropy) words += " entropy";
  if (loss.class_weight_dtype) words += " class_weights";
  return words;
}

LossOptions LossFromTuningWords(const TuningShapeWords& w, DType dtype) {
  return {.label_smoothing = w.Has("smoothing") ? 0.1f : 0.0f,
          .z_loss = w.Has("z_loss") ? 1e-4f : 0.0f,
          .softcap = w.Has("softcap") ? 30.0f : 0.0f,
          .argmax = w.Has("argmax"),
          .entropy = w.Has("entropy"),
          .class_weight_dtype = w.Has("class_weights") ? std::optional(dtype) : std::nullopt};
}

std::string LossValueText(float value) { return fmt::format("{}", value == 0 ? 0.0f : value); }

namespace {

// A flag that sets one float or bool field of the options.
SpecFlag<LossOptions> FloatFlag(std::string name, std::string help, float LossOptions::*field,
                                std::string spec_field) {
  return {{.name = std::move(name),
           .help = std::move(help),
           .kind = FlagKind::kFloat,
           .field = std::move(spec_field)},
          [field](LossOptions& loss, const FlagValue& v) {
            loss.*field = v.real;
            return absl::OkStatus();
          }};
}
SpecFlag<LossOptions> SwitchFlag(std::string name, std::string help, bool LossOptions::*field) {
  return {{.name = std::move(name), .help = std::move(help), .kind = FlagKind::kSwitch},
          [field](LossOptions& loss, const FlagValue& v) {
            loss.*field = v.on;
            return absl::OkStatus();
          }};
}

}  // namespace

FlagInfo TargetTypeFlag() {
  return {.name = "--target-type",
          .help = "Targets: int32 or int64 ({ops})",
          .choices = {"int32", "int64"},
          .default_text = "int64"};
}

IndexType TargetTypeOf(const FlagValue& v) {
  return v.text == "int32" ? IndexType::kInt32 : IndexType::kInt64;
}

std::vector<SpecFlag<LossOptions>> LossFlags() {
  return {
      {TargetTypeFlag(),
       [](LossOptions& loss, const FlagValue& v) {
         loss.target_type = TargetTypeOf(v);
         return absl::OkStatus();
       }},
      {{.name = "--reduction",
        .help = "none, sum or mean ({ops})",
        .choices = {"none", "sum", "mean"},
        .default_text = "mean"},
       [](LossOptions& loss, const FlagValue& v) {
         loss.reduction = v.text == "none"  ? Reduction::kNone
                          : v.text == "sum" ? Reduction::kSum
                                            : Reduction::kMean;
         return absl::OkStatus();
       }},
      FloatFlag("--label-smoothing", "Label smoothing in [0, 1) ({ops})",
                &LossOptions::label_smoothing, "label_smoothing"),
      FloatFlag("--z-loss", "The z-loss coefficient: adds z_loss * lse^2 per row ({ops})",
                &LossOptions::z_loss, "z_loss"),
      FloatFlag("--softcap", "Logit soft-cap, 0 = off ({ops})", &LossOptions::softcap, "softcap"),
      SwitchFlag("--argmax", "Also write the predicted token per row ({ops})",
                 &LossOptions::argmax),
      SwitchFlag("--entropy", "Also write the softmax's entropy per row ({ops})",
                 &LossOptions::entropy),
      ClassWeightsFlag(FlagCommand::kCompile,
                       "Per-class weights of this dtype, fp32 or --dtype's ({ops}; the weights "
                       "themselves are a launch argument)"),
  };
}

SpecFlag<LossOptions> ClassWeightsFlag(FlagCommand command, std::string help) {
  return {{.command = command,
           .name = "--class-weights",
           .help = std::move(help),
           .kind = FlagKind::kDType,
           .field = "class_weight_dtype"},
          [](LossOptions& loss, const FlagValue& v) -> absl::Status {
            KJIT_ASSIGN_OR_RETURN(loss.class_weight_dtype, ParseDType(v.text));
            return absl::OkStatus();
          }};
}

}  // namespace ops
}  // namespace kjit
