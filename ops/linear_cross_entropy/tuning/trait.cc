#include "ops/linear_cross_entropy/tuning/trait.h"

#include <utility>
#include <vector>

#include "ops/common/loss_options.h"

namespace kjit::ops {

using Trait = OpTrait<LinearCrossEntropySpec>;

std::vector<SpecFlag<LinearCrossEntropySpec>> Trait::Flags() {
  std::vector<SpecFlag<Spec>> flags = {IntFieldFlag(VocabFlag(), &Spec::vocab),
                                       IntFieldFlag(HiddenFlag(), &Spec::hidden)};
  for (auto& f : FlagsOfPart(LossFlags(), &Spec::loss)) flags.push_back(std::move(f));
  // Its trial has no class weights: a model tuned with them leaves the fused op out.
  flags.push_back({ClassWeightsFlag(FlagCommand::kTune, "").info, nullptr});
  return flags;
}

std::vector<LinearCrossEntropySpec> Trait::ModelOps(const ModelShape& m, DType dtype) {
  return {{.vocab = m.vocab,
           .hidden = m.hidden,
           .dtype = dtype,
           .loss = {.softcap = static_cast<float>(m.final_logit_softcapping)}}};
}

}  // namespace kjit::ops
