// The shapes a model gives kjit's kernels: hidden size, vocab, RMSNorm eps and style, logit
// soft-capping. From a built-in preset (values from each model's published config.json) or from a
// Hugging Face config.json on disk, for `kjit-tune` to prebuild and tune the kernels a model needs.
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
  bool gemma_norm = false;             // (1 + w) weights, computed in fp32 throughout
  double final_logit_softcapping = 0;  // 0: none
};

// The preset names, in the order `kjit-tune --help` lists them.
std::vector<std::string> ModelPresetNames();
// NotFound naming the known presets for an unknown name.
absl::StatusOr<ModelConfig> ModelPreset(std::string_view name);

// Reads hidden_size, vocab_size, rms_norm_eps and final_logit_softcapping (optional), and
// model_type for the norm style ("gemma*" models use (1 + w)). A nested "text_config" (multimodal
// checkpoints) is used when the top level lacks hidden_size. `source` names the input in errors.
absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view source);
absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path);

}  // namespace kjit::autotune
