#include "ops/log_probs/tuning/trait.h"

#include <vector>

#include "ops/common/loss_options.h"
#include "ops/cross_entropy/tuning/search_space.h"

namespace kjit::ops {

using Trait = OpTrait<LogProbsSpec>;

std::vector<Candidate<CrossEntropyConfig>> Trait::SearchSpace(const Spec& s,
                                                              const Config& heuristic, int arch) {
  std::vector<Candidate<Config>> streaming;
  for (auto& c : CrossEntropySearchSpace(s.vocab, heuristic.vec, arch)) {
    if (c.config.cluster == 0 && c.config.staged == 0) streaming.push_back(std::move(c));
  }
  return streaming;
}

std::vector<SpecFlag<LogProbsSpec>> Trait::Flags() {
  return {IntFieldFlag(VocabFlag(), &Spec::vocab),
          {TargetTypeFlag(),
           [](Spec& s, const FlagValue& v) {
             s.target_type = TargetTypeOf(v);
             return absl::OkStatus();
           }},
          {{.name = "--temperature",
            .help = "Temperature T the logits are divided by, > 0 ({ops})",
            .kind = FlagKind::kFloat,
            .field = "temperature"},
           [](Spec& s, const FlagValue& v) {
             s.temperature = v.real;
             return absl::OkStatus();
           }},
          {{.name = "--entropy",
            .help = "Also write the softmax's entropy per row ({ops})",
            .kind = FlagKind::kSwitch},
           [](Spec& s, const FlagValue& v) {
             s.entropy = v.on;
             return absl::OkStatus();
           }}};
}

}  // namespace kjit::ops
