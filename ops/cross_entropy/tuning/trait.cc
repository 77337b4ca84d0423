#include "ops/cross_entropy/tuning/trait.h"

#include <utility>
#include <vector>

#include "ops/common/loss_options.h"
#include "ops/cross_entropy/tuning/search_space.h"

namespace kjit::ops {

using Trait = OpTrait<CrossEntropySpec>;

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
