#include "runtime/tuning.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/nvrtc.h"
#include "runtime/runtime.h"
#include "runtime/runtime_state.h"

namespace kjit {

std::string TuningOp(const RmsNormSpec& spec) {
  return spec.fused_residual ? "rms_norm+residual" : "rms_norm";
}
std::string TuningOp(const CrossEntropySpec&) { return "cross_entropy"; }
std::string StreamingTuningOp(const CrossEntropySpec& spec) { return TuningOp(spec) + ".forward"; }

std::string TuningShape(const RmsNormSpec& spec) {
  std::string s = fmt::format("hidden={}", spec.hidden);
  if (spec.casting == RmsNormCasting::kGemma) s += " gemma";
  if (spec.weight_dtype && *spec.weight_dtype != spec.dtype) {
    s += fmt::format(" weight={}", Name(*spec.weight_dtype));
  }
  return s;
}

std::string TuningShape(const CrossEntropySpec& spec) {
  std::string s = fmt::format("vocab={}", spec.vocab);
  if (spec.softcap > 0) s += " softcap";
  if (spec.label_smoothing > 0) s += " smoothing";
  if (spec.lse_square_scale > 0) s += " z_loss";
  if (spec.argmax) s += " argmax";
  return s;
}

namespace {

using nlohmann::json;

json SpecObject(const OpSpec& op) {
  if (const auto* r = std::get_if<RmsNormSpec>(&op)) {
    json j = {{"op", "rms_norm"},
              {"hidden", r->hidden},
              {"dtype", kjit::Name(r->dtype)},
              {"eps", r->eps},
              {"weight_offset", r->weight_offset},
              {"gemma_casting", r->casting == RmsNormCasting::kGemma},
              {"fused_residual", r->fused_residual}};
    if (r->weight_dtype) j["weight_dtype"] = kjit::Name(*r->weight_dtype);
    return j;
  }
  const auto& c = std::get<CrossEntropySpec>(op);
  return {{"op", "cross_entropy"},
          {"vocab", c.vocab},
          {"dtype", kjit::Name(c.dtype)},
          {"target_type", kjit::Name(c.target_type)},
          {"ignore_index", c.ignore_index},
          {"reduction", kjit::Name(c.reduction)},
          {"label_smoothing", c.label_smoothing},
          {"lse_square_scale", c.lse_square_scale},
          {"softcap", c.softcap},
          {"argmax", c.argmax}};
}

absl::StatusOr<DType> DTypeField(const json& j, const char* field) {
  return ParseDType(j.at(field).get<std::string>());
}

// Throws nlohmann's exceptions for missing or mistyped fields; SpecFromJson turns them into errors.
absl::StatusOr<OpSpec> SpecFromObject(const json& j) {
  const std::string op = j.at("op").get<std::string>();
  if (op == "rms_norm") {
    RmsNormSpec s{.hidden = j.at("hidden").get<int64_t>(),
                  .eps = j.at("eps").get<float>(),
                  .weight_offset = j.at("weight_offset").get<float>(),
                  .casting = j.at("gemma_casting").get<bool>() ? RmsNormCasting::kGemma
                                                              : RmsNormCasting::kLlama,
                  .fused_residual = j.at("fused_residual").get<bool>()};
    KJIT_ASSIGN_OR_RETURN(s.dtype, DTypeField(j, "dtype"));
    if (j.contains("weight_dtype")) {
      KJIT_ASSIGN_OR_RETURN(s.weight_dtype, DTypeField(j, "weight_dtype"));
    }
    KJIT_RETURN_IF_ERROR(ValidateRmsNormSpec(s));
    return s;
  }
  if (op == "cross_entropy") {
    CrossEntropySpec s{.vocab = j.at("vocab").get<int64_t>(),
                       .ignore_index = j.at("ignore_index").get<int64_t>(),
                       .label_smoothing = j.at("label_smoothing").get<float>(),
                       .lse_square_scale = j.at("lse_square_scale").get<float>(),
                       .softcap = j.at("softcap").get<float>(),
                       .argmax = j.at("argmax").get<bool>()};
    KJIT_ASSIGN_OR_RETURN(s.dtype, DTypeField(j, "dtype"));
    const std::string targets = j.at("target_type").get<std::string>();
    if (targets != "int32" && targets != "int64") {
      return absl::InvalidArgumentError(fmt::format("target_type: \"{}\" is not int32 or int64", targets));
    }
    s.target_type = targets == "int32" ? IndexType::kInt32 : IndexType::kInt64;
    const std::string reduction = j.at("reduction").get<std::string>();
    bool known = false;
    for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
      if (reduction == kjit::Name(r)) s.reduction = r, known = true;
    }
    if (!known) {
      return absl::InvalidArgumentError(fmt::format("reduction: \"{}\" is not none, sum or mean", reduction));
    }
    KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(s));
    return s;
  }
  return absl::InvalidArgumentError(fmt::format("op: \"{}\" is not rms_norm or cross_entropy", op));
}

}  // namespace

std::string SpecToJson(const OpSpec& spec) { return SpecObject(spec).dump(); }

absl::StatusOr<OpSpec> SpecFromJson(std::string_view text) {
  try {
    return SpecFromObject(json::parse(text));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(fmt::format("op spec: {}", e.what()));
  }
}

namespace internal {

autotune::TuningKey TuningKeyFor(const RuntimeState& rt, const std::string& op,
                                 const std::string& shape, DType dtype, int64_t rows) {
  autotune::TuningKey k{.op = op, .dtype = Name(dtype), .shape = shape,
                        .rows_bucket = autotune::RowsBucket(rows)};
  if (rt.compile_only) return k;
  k.device = rt.device.name;
  k.arch = rt.target.arch;
  k.driver = rt.driver->version();
  if (auto nvrtc = jit::Nvrtc::Get(); nvrtc.ok()) {
    k.nvrtc = (*nvrtc)->version().major * 1000 + (*nvrtc)->version().minor * 10;
  }
  return k;
}

}  // namespace internal

autotune::TuningKey TuningKeyFor(const Runtime& rt, const RmsNormSpec& spec, int64_t rows) {
  return internal::TuningKeyFor(rt.state(), TuningOp(spec), TuningShape(spec), spec.dtype, rows);
}
autotune::TuningKey TuningKeyFor(const Runtime& rt, const CrossEntropySpec& spec, int64_t rows) {
  return internal::TuningKeyFor(rt.state(), TuningOp(spec), TuningShape(spec), spec.dtype, rows);
}

}  // namespace kjit
