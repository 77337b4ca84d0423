#include "autotune/model_config.h"

#include <cmath>
#include <limits>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "autotune/model_families.h"
#include "jit/file_io.h"

namespace kjit::autotune {

namespace {

// From each model's config.json on the Hugging Face Hub.
const std::vector<ModelConfig>& Presets() {
  static const auto* presets = new std::vector<ModelConfig>{
      {.name = "llama-3.1-8b", .hidden_size = 4096, .vocab_size = 128256, .rms_norm_eps = 1e-5},
      {.name = "llama-3.1-70b", .hidden_size = 8192, .vocab_size = 128256, .rms_norm_eps = 1e-5},
      {.name = "llama-3.2-1b", .hidden_size = 2048, .vocab_size = 128256, .rms_norm_eps = 1e-5},
      {.name = "mistral-7b", .hidden_size = 4096, .vocab_size = 32768, .rms_norm_eps = 1e-5},
      {.name = "qwen2.5-7b", .hidden_size = 3584, .vocab_size = 152064, .rms_norm_eps = 1e-6},
      {.name = "gemma-2-9b",
       .hidden_size = 3584,
       .vocab_size = 256000,
       .rms_norm_eps = 1e-6,
       .norm_rounds_once = true,
       .norm_weight_offset = 1.0,
       .final_logit_softcapping = 30.0},
      {.name = "phi-3-mini", .hidden_size = 3072, .vocab_size = 32064, .rms_norm_eps = 1e-5},
  };
  return *presets;
}

absl::Status Invalid(std::string_view source, const std::string& what) {
  return absl::InvalidArgumentError(fmt::format("{}: {}", source, what));
}

// A positive integer field, required.
absl::StatusOr<int64_t> SizeField(const nlohmann::json& j, const char* key,
                                  std::string_view source) {
  auto it = j.find(key);
  if (it == j.end()) return Invalid(source, fmt::format("\"{}\" is missing", key));
  if (!it->is_number_integer() || it->get<int64_t>() <= 0) {
    return Invalid(source,
                   fmt::format("\"{}\" must be a positive integer, got {}", key, it->dump()));
  }
  return it->get<int64_t>();
}

// A finite number >= 0; `fallback` when absent or null.
absl::StatusOr<double> NumberField(const nlohmann::json& j, const char* key, double fallback,
                                   std::string_view source) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (!it->is_number() || !std::isfinite(it->get<double>()) || it->get<double>() < 0) {
    return Invalid(source, fmt::format("\"{}\" must be a number >= 0, got {}", key, it->dump()));
  }
  return it->get<double>();
}

using FamilyTable = std::map<std::string, ModelFamily, std::less<>>;

// One family of model_families.json; the keys only apply_to reads (logits_divided_by,
// conditional_causal_lm) are left to it.
absl::StatusOr<ModelFamily> ParseFamily(const std::string& name, const nlohmann::json& j) {
  const auto bad = [&](const std::string& what) {
    return absl::InternalError(
        fmt::format("model_families.json (embedded): family \"{}\": {}", name, what));
  };
  if (!j.is_object()) return bad("expected an object");
  ModelFamily family;
  const auto casting = j.find("norm_casting");
  if (casting == j.end() || !casting->is_string()) return bad("\"norm_casting\" is missing");
  if (*casting == "llama") {
    family.norm_rounds_once = false;
  } else if (*casting == "gemma") {
    family.norm_rounds_once = true;
  } else {
    return bad(
        fmt::format("\"norm_casting\" must be \"llama\" or \"gemma\", got {}", casting->dump()));
  }
  if (auto it = j.find("norm_weight_offset"); it != j.end()) {
    if (!it->is_number()) return bad("\"norm_weight_offset\" must be a number");
    family.norm_weight_offset = it->get<double>();
  }
  if (auto it = j.find("softcaps_logits"); it != j.end()) {
    if (!it->is_boolean()) return bad("\"softcaps_logits\" must be true or false");
    family.softcaps_logits = it->get<bool>();
  }
  return family;
}

// The embedded table, parsed once (its error, if malformed, every time it is asked).
const absl::StatusOr<FamilyTable>& Families() {
  static const auto* table = new absl::StatusOr<FamilyTable>([]() -> absl::StatusOr<FamilyTable> {
    const nlohmann::json j =
        nlohmann::json::parse(ModelFamiliesJson(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("families") ||
        !j["families"].is_object()) {
      return absl::InternalError(
          "model_families.json (embedded): expected an object with a \"families\" object");
    }
    FamilyTable families;
    for (const auto& [name, entry] : j["families"].items()) {
      KJIT_ASSIGN_OR_RETURN(families[name], ParseFamily(name, entry));
    }
    return families;
  }());
  return *table;
}

}  // namespace

std::vector<std::string> ModelFamilyNames() {
  std::vector<std::string> names;
  if (Families().ok()) {
    for (const auto& [name, family] : *Families()) names.push_back(name);
  }
  return names;
}

absl::StatusOr<ModelFamily> ModelFamilyOf(std::string_view model_type) {
  KJIT_RETURN_IF_ERROR(Families().status());
  if (auto it = Families()->find(model_type); it != Families()->end()) return it->second;
  return absl::InvalidArgumentError(fmt::format(
      "model_type {} is not a model family kjit knows ({}); pass --hidden and --vocab to prepare "
      "the kernels of a shape",
      nlohmann::json(std::string(model_type)).dump(), fmt::join(ModelFamilyNames(), ", ")));
}

std::vector<std::string> ModelPresetNames() {
  std::vector<std::string> names;
  for (const ModelConfig& m : Presets()) names.push_back(m.name);
  return names;
}

absl::StatusOr<ModelConfig> ModelPreset(std::string_view name) {
  for (const ModelConfig& m : Presets()) {
    if (m.name == name) return m;
  }
  std::string known;
  for (const std::string& n : ModelPresetNames()) known += (known.empty() ? "" : ", ") + n;
  return absl::NotFoundError(fmt::format(
      "model: no preset named '{}'; known: {} (or pass --config config.json)", name, known));
}

absl::StatusOr<ModelConfig> ParseHfConfig(std::string_view json_text, std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Invalid(source, "not valid JSON");
  if (!j.is_object()) return Invalid(source, "expected a JSON object at the top level");
  if (!j.contains("hidden_size") && j.contains("text_config") && j["text_config"].is_object()) {
    j = j["text_config"];
  }
  ModelConfig m;
  if (auto it = j.find("_name_or_path"); it != j.end() && it->is_string())
    m.name = it->get<std::string>();
  if (m.name.empty()) m.name = std::string(source);
  KJIT_ASSIGN_OR_RETURN(m.hidden_size, SizeField(j, "hidden_size", source));
  KJIT_ASSIGN_OR_RETURN(m.vocab_size, SizeField(j, "vocab_size", source));
  KJIT_ASSIGN_OR_RETURN(m.rms_norm_eps, NumberField(j, "rms_norm_eps", 1e-6, source));
  KJIT_ASSIGN_OR_RETURN(m.final_logit_softcapping,
                        NumberField(j, "final_logit_softcapping", 0, source));
  if (auto it = j.find("model_type"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) {
      return Invalid(source, fmt::format("\"model_type\" must be a string, got {}", it->dump()));
    }
    auto family = ModelFamilyOf(it->get<std::string>());
    if (!family.ok()) return Invalid(source, std::string(family.status().message()));
    m.norm_rounds_once = family->norm_rounds_once;
    m.norm_weight_offset = family->norm_weight_offset;
    if (!family->softcaps_logits) m.final_logit_softcapping = 0;
  }
  return m;
}

absl::StatusOr<ModelConfig> LoadHfConfig(const std::string& path) {
  absl::StatusOr<std::string> text = jit::ReadRegularFile(path, std::numeric_limits<size_t>::max());
  if (!text.ok()) return absl::NotFoundError(fmt::format("--config {}: cannot be read", path));
  return ParseHfConfig(*text, path);
}

}  // namespace kjit::autotune
