#include "ops/cross_entropy/trait.h"

#include <utility>
#include <vector>

#include <fmt/format.h>

#include "ops/common/json_fields.h"
#include "ops/common/loss_options.h"
#include "ops/cross_entropy/search_space.h"

namespace kjit::ops {

using Trait = OpTrait<CrossEntropySpec>;

std::string Trait::TuningOp(const Spec&) { return std::string(kName); }

std::string Trait::TuningShape(const Spec& s) {
  return fmt::format("vocab={}", s.vocab) + LossTuningWords(s.loss);
}

std::optional<CrossEntropySpec> Trait::FromTuningKey(std::string_view, const TuningShapeWords& w,
                                                     DType dtype) {
  return Spec{.vocab = w.Int("vocab"), .dtype = dtype, .loss = LossFromTuningWords(w, dtype)};
}

nlohmann::json Trait::ToJson(const Spec& s) {
  nlohmann::json j = {{"op", kName}, {"vocab", s.vocab}, {"dtype", Name(s.dtype)}};
  LossOptionsToJson(s.loss, j);
  return j;
}

absl::StatusOr<CrossEntropySpec> Trait::FromJson(const nlohmann::json& j) {
  KJIT_ASSIGN_OR_RETURN(JsonFields in, JsonFields::Of(j));
  Spec s;
  KJIT_ASSIGN_OR_RETURN(s.vocab, in.Int("vocab"));
  KJIT_ASSIGN_OR_RETURN(s.dtype, in.DTypeOf("dtype"));
  KJIT_ASSIGN_OR_RETURN(s.loss, LossOptionsFromJson(in));
  KJIT_RETURN_IF_ERROR(in.NoOthers(kName, {"op"}));
  KJIT_RETURN_IF_ERROR(ValidateCrossEntropySpec(s));
  return s;
}

std::vector<Candidate<CrossEntropyConfig>> Trait::SearchSpace(const Spec& s,
                                                              const Config& heuristic, int arch) {
  return CrossEntropySearchSpace(s.vocab, heuristic.vec, arch);
}

std::vector<SpecFlag<CrossEntropySpec>> Trait::Flags() {
  std::vector<SpecFlag<Spec>> flags = {IntFieldFlag(VocabFlag(), &Spec::vocab)};
  for (auto& f :
       FlagsOfPart({ClassWeightsFlag(FlagCommand::kBench,
                                     "cross_entropy with per-class weights of this dtype (fp32 or "
                                     "--dtype's), uniform in [0.5, 1.5)"),
                    ClassWeightsFlag(
                        FlagCommand::kTune,
                        "Tune the loss with per-class weights of this dtype (fp32 or --dtype)")},
                   &Spec::loss)) {
    flags.push_back(std::move(f));
  }
  for (auto& f : FlagsOfPart(LossFlags(), &Spec::loss)) flags.push_back(std::move(f));
  return flags;
}

std::vector<CrossEntropySpec> Trait::ModelOps(const ModelShape& m, DType dtype) {
  return {{.vocab = m.vocab,
           .dtype = dtype,
           .loss = {.softcap = static_cast<float>(m.final_logit_softcapping)}}};
}

}  // namespace kjit::ops
