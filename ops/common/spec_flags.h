// The command-line flags an op declares in its trait (OpTrait::Flags, ops/op_trait.h): each sets
// one field of the op's spec for `kjit compile`, `kjit bench` or `kjit-tune`. The tools build
// their options from the registry's merge of every op's flags (ops/registry.h's CommandFlags), so
// a new op brings its flags with it and no tool names an op.
//
//   std::vector<SpecFlag<RmsNormSpec>> OpTrait<RmsNormSpec>::Flags() {
//     return {IntFieldFlag(HiddenFlag(), &RmsNormSpec::hidden),   // --hidden, shared by ops
//             {{.name = "--residual", .help = "Fuse the residual add ({ops})",
//               .kind = FlagKind::kSwitch},
//              [](RmsNormSpec& s, const FlagValue& v) {
//                s.fused_residual = v.on;
//                return absl::OkStatus();
//              }}};
//   }
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kjit/dtype.h"
#include "kjit/status.h"

namespace kjit::ops {

// The command a flag belongs to: the same flag may be declared for several, each with its help.
enum class FlagCommand { kCompile, kBench, kTune };

// How the tools parse a flag's value, and which FlagValue member holds it.
enum class FlagKind {
  kInt,     // FlagValue::integer, within [min, max]
  kFloat,   // FlagValue::real
  kText,    // FlagValue::text, one of choices
  kDType,   // FlagValue::text, a dtype name (ParseDType)
  kSwitch,  // FlagValue::on: a flag without a value
};

// A flag's parsed value; only the member of its kind is set.
struct FlagValue {
  int64_t integer = 0;
  float real = 0;
  std::string text;
  bool on = false;
};

// What a tool needs to offer a flag, the same for every op that declares it.
struct FlagInfo {
  FlagCommand command = FlagCommand::kCompile;
  std::string name;  // "--hidden"
  // The help text; "{ops}" stands for the ops that declare the flag ("rms_norm, cross_entropy").
  std::string help;
  FlagKind kind = FlagKind::kText;
  std::vector<std::string> choices;  // kText: the values allowed
  std::string default_text;          // kText: the default shown; empty: none (the spec's own)
  int64_t min = 0, max = 0;          // kInt: the range allowed
  // The spec field its op's checks name in errors ("label_smoothing: 1 must be in [0, 1)"), so a
  // tool can name the flag instead; empty: none.
  std::string field;
};

// One op's flag: its info and how it sets the op's spec. Given a flag its op does not declare, a
// tool reports "--flag does not apply to --op name".
template <typename Spec>
struct SpecFlag {
  FlagInfo info;
  // Sets the spec from the value (validation is the spec's own, after every flag). Null: only for
  // kjit-tune, the model's fine-tuning leaves this op out when the flag is given.
  std::function<absl::Status(Spec&, const FlagValue&)> apply;
};

// The size flags every op that has the size shares: `kjit compile`'s --hidden and --vocab.
inline FlagInfo HiddenFlag() {
  return {.name = "--hidden",
          .help = "Hidden size ({ops}; required)",
          .kind = FlagKind::kInt,
          .min = 1,
          .max = 65536,
          .field = "hidden"};
}
inline FlagInfo VocabFlag() {
  return {.name = "--vocab",
          .help = "Vocab size ({ops}; required)",
          .kind = FlagKind::kInt,
          .min = 2,
          .max = 1 << 20,
          .field = "vocab"};
}

// The facts about a model that decide which ops its fine-tuning runs (OpTrait::ModelOps), as
// kjit-tune reads them from a preset or a Hugging Face config.
struct ModelShape {
  int64_t hidden = 0;
  int64_t vocab = 0;
  double rms_norm_eps = 1e-6;
  double final_logit_softcapping = 0;  // 0: none
  bool norm_rounds_once = false;  // fp32 throughout, rounded once (Gemma's casting); else LLaMA's
  double norm_weight_offset = 0;  // 1: Gemma's (1 + w) norms
};

// A kInt flag that sets one integer field of the spec.
template <typename Spec>
SpecFlag<Spec> IntFieldFlag(FlagInfo info, int64_t Spec::*field) {
  return {std::move(info), [field](Spec& s, const FlagValue& v) {
            s.*field = v.integer;
            return absl::OkStatus();
          }};
}

// Flags that set a part of the spec (its LossOptions, say) as flags of the whole spec.
template <typename Spec, typename Part>
std::vector<SpecFlag<Spec>> FlagsOfPart(const std::vector<SpecFlag<Part>>& flags,
                                        Part Spec::*part) {
  std::vector<SpecFlag<Spec>> out;
  for (const SpecFlag<Part>& f : flags) {
    out.push_back({f.info, [apply = f.apply, part](Spec& s, const FlagValue& v) {
                     return apply(s.*part, v);
                   }});
  }
  return out;
}

}  // namespace kjit::ops
