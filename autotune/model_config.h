// The shapes a model gives kjit's kernels: hidden size, vocab, RMSNorm eps and style, logit
// soft-capping. From a built-in preset (values from each model's published config.json) or from a
// Hugging Face config.json on disk, for `kjit-tune` to prebuild and tune the kernels a model needs;
// a config's model_type names its family in python/kjit/model_families.json, the table apply_to
// reads too, so that kjit-tune prepares the kernels apply_to runs.
//
//   KJIT_ASSIGN_OR_RETURN(ModelConfig m, ModelPreset("llama-3.1-8b"));
//   // m.hidden_size == 4096, m.vocab_size == 128256, m.rms_norm_eps == 1e-5
//   KJIT_ASSIGN_OR_RETURN(ModelConfig q, LoadHfConfig("qwen/config.json"));
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/status.h"

namespace kjit::autotune {

struct ModelConfig {
  std::string name;
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-6;
  // How the RMSNorms round: true for fp32 throughout, rounded once (Gemma's, OLMo 2's: casting
  // "gemma"), false for LLaMA's (the normalized x rounded to the dtype, then times the weight).
  bool norm_rounds_once = false;
  double norm_weight_offset = 0;       // 1: Gemma's (1 + w) weights
  double final_logit_softcapping = 0;  // 0: none
};

// What model_families.json says of a family: how its RMSNorms round, their weight offset, and
// whether its forward soft-caps the logits by config.final_logit_softcapping.
struct ModelFamily {
  bool norm_rounds_once = false;  // as ModelConfig's
  double norm_weight_offset = 0;
  bool softcaps_logits = false;
};

// The families' model_type names, sorted.
std::vector<std::string> ModelFamilyNames();
// InvalidArgument naming the known families for a model_type the table lacks; Internal when the
// embedded table is malformed.
absl::StatusOr<ModelFamily> ModelFamilyOf(std::string_view model_type);

// The preset names, in the order `kjit-tune --help` lists them.
std::vector<std::string> ModelPresetNames();
// NotFound naming the known presets for an unknown name.
absl::StatusOr<ModelConfig> ModelPreset(std::string_view name);

// Reads hidden_size, vocab_size, rms_norm_eps and final_logit_softcapping (optional), and
// model_type (optional) for its family's norms, and whether the soft-cap applies: a family whose
// forward does not soft-cap (llama) gets none whatever its config says. Without model_type the
// norms are LLaMA's and the soft-cap the config's; a model_type the table lacks is an error. A
// nested "text_config" (multimodal checkpoints) is used when the top level lacks hidden_size.
// `source` names the input in errors.
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view source);
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

}  // namespace kjit::autotune
