#include "ops/rms_norm/tuning/trait.h"

#include <string>
#include <utility>
#include <vector>

#include "jit/status_helpers.h"
#include "ops/rms_norm/tuning/search_space.h"

namespace kjit::ops {

using Trait = OpTrait<RmsNormSpec>;

std::vector<TunedPass> Trait::TunedPasses(const Spec& s) {
  return {{Pass::kForwardBackward, TuningOp(s)}};
}

std::vector<Candidate<RmsNormConfig>> Trait::SearchSpace(const Spec& s, const Config& heuristic,
                                                         int /*arch*/) {
  return RmsNormSearchSpace(s.hidden, heuristic.vec, static_cast<int>(SizeOf(s.dtype)));
}

std::vector<Pass> Trait::PassesToTime(const Config& c, const Config& heuristic, Pass /*tuned*/) {
  if (c == heuristic) return {Pass::kForward, Pass::kBackward};
  return {c.forward == heuristic.forward ? Pass::kBackward : Pass::kForward};
}

std::optional<RmsNormConfig> Trait::Combine(const Config& heuristic, const Config& fastest_forward,
                                            const Config& fastest_backward) {
  Config best = heuristic;
  best.forward = fastest_forward.forward;
  best.backward = fastest_backward.backward;
  return best;
}

namespace {

absl::Status SetCasting(RmsNormSpec& s, const FlagValue& v) {
  KJIT_ASSIGN_OR_RETURN(s.casting, ParseRmsNormCasting(v.text));
  return absl::OkStatus();
}

SpecFlag<RmsNormSpec> CastingFlag(FlagCommand command, std::string help, std::string shown) {
  return {{.command = command,
           .name = "--casting",
           .help = std::move(help),
           .choices = {"llama", "gemma", "none"},
           .default_text = std::move(shown)},
          SetCasting};
}

}  // namespace

std::vector<SpecFlag<RmsNormSpec>> Trait::Flags() {
  return {
      IntFieldFlag(HiddenFlag(), &Spec::hidden),
      {{.name = "--weight-dtype",
        .help = "Weight dtype (default: --dtype; {ops})",
        .kind = FlagKind::kDType,
        .field = "weight_dtype"},
       [](Spec& s, const FlagValue& v) -> absl::Status {
         KJIT_ASSIGN_OR_RETURN(s.weight_dtype, ParseDType(v.text));
         return absl::OkStatus();
       }},
      CastingFlag(FlagCommand::kCompile,
                  "llama, gemma or none: where rms_norm rounds to the dtype (kjit/rms_norm.h; none "
                  "computes in the dtype, as eager PyTorch would, and needs the weight in it)",
                  "llama"),
      {{.name = "--residual", .help = "Fuse the residual add ({ops})", .kind = FlagKind::kSwitch},
       [](Spec& s, const FlagValue& v) {
         s.fused_residual = v.on;
         return absl::OkStatus();
       }},
      CastingFlag(FlagCommand::kBench, "rms_norm's casting: llama (default), gemma or none", ""),
      CastingFlag(FlagCommand::kTune,
                  "The norms' casting, llama, gemma or none (default: the model's)", ""),
  };
}

std::vector<RmsNormSpec> Trait::ModelOps(const ModelShape& m, DType dtype) {
  std::vector<Spec> norms;
  for (bool residual : {false, true}) {
    norms.push_back(
        {.hidden = m.hidden,
         .dtype = dtype,
         .eps = static_cast<float>(m.rms_norm_eps),
         .weight_offset = static_cast<float>(m.norm_weight_offset),
         .casting = m.norm_rounds_once ? RmsNormCasting::kGemma : RmsNormCasting::kLlama,
         .fused_residual = residual});
  }
  return norms;
}

}  // namespace kjit::ops
