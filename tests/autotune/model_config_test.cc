// Model presets and the Hugging Face config.json reader behind `kjit-tune --model/--config`.
#include "autotune/model_config.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "autotune/model_families.h"

namespace kjit::autotune {
namespace {

TEST(ModelConfigTest, PresetsCarryTheirPublishedShapes) {
  const std::vector<std::string> names = ModelPresetNames();
  for (const char* want : {"llama-3.1-8b", "llama-3.1-70b", "llama-3.2-1b", "mistral-7b",
                           "qwen2.5-7b", "gemma-2-9b", "phi-3-mini"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want;
    auto m = ModelPreset(want);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_GT(m->hidden_size, 0);
    EXPECT_GT(m->vocab_size, 0);
  }
  auto llama = ModelPreset("llama-3.1-8b");
  EXPECT_EQ(llama->hidden_size, 4096);
  EXPECT_EQ(llama->vocab_size, 128256);
  EXPECT_DOUBLE_EQ(llama->rms_norm_eps, 1e-5);
  EXPECT_FALSE(llama->norm_rounds_once);
  EXPECT_EQ(llama->norm_weight_offset, 0);
  auto gemma = ModelPreset("gemma-2-9b");
  EXPECT_EQ(gemma->hidden_size, 3584);
  EXPECT_EQ(gemma->vocab_size, 256000);
  EXPECT_TRUE(gemma->norm_rounds_once);
  EXPECT_EQ(gemma->norm_weight_offset, 1);
  EXPECT_DOUBLE_EQ(gemma->final_logit_softcapping, 30.0);
  EXPECT_EQ(ModelPreset("qwen2.5-7b")->vocab_size, 152064);
}

TEST(ModelConfigTest, UnknownPresetNamesTheKnownOnes) {
  auto m = ModelPreset("llama-9");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(m.status().message()).find("llama-3.1-8b"), std::string::npos)
      << m.status();
}

TEST(ModelConfigTest, ParsesAHuggingFaceConfig) {
  auto m = ParseHfConfig(R"({"_name_or_path": "google/gemma-2-9b", "model_type": "gemma2",
                             "hidden_size": 3584, "vocab_size": 256000, "rms_norm_eps": 1e-06,
                             "final_logit_softcapping": 30.0, "torch_dtype": "bfloat16"})",
                         "config.json");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->name, "google/gemma-2-9b");
  EXPECT_EQ(m->hidden_size, 3584);
  EXPECT_EQ(m->vocab_size, 256000);
  EXPECT_DOUBLE_EQ(m->rms_norm_eps, 1e-6);
  EXPECT_TRUE(m->norm_rounds_once);
  EXPECT_EQ(m->norm_weight_offset, 1);
  EXPECT_DOUBLE_EQ(m->final_logit_softcapping, 30.0);

  // Optional fields absent or null; a multimodal checkpoint's text_config.
  auto plain = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 2048, "vocab_size": 128256,
                                 "final_logit_softcapping": null})",
                             "a.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->norm_rounds_once);
  EXPECT_EQ(plain->final_logit_softcapping, 0);
  EXPECT_EQ(plain->name, "a.json");
  auto nested =
      ParseHfConfig(R"({"text_config": {"hidden_size": 5120, "vocab_size": 131072}})", "b");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->hidden_size, 5120);
}

// The families whose norms kjit-tune once took for LLaMA's (model_type not "gemma*") while apply_to
// ran Gemma's casting, and LLaMA, whose forward never soft-caps whatever its config says.
TEST(ModelConfigTest, FamiliesGetTheNormsAndSoftCapApplyToRuns) {
  for (const char* type : {"olmo2", "olmo3", "gpt_oss", "helium"}) {
    auto m = ParseHfConfig(fmt::format(R"({{"model_type": "{}", "hidden_size": 64,
                                            "vocab_size": 100}})",
                                       type),
                           "c.json");
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE(m->norm_rounds_once) << type;
    EXPECT_EQ(m->norm_weight_offset, 0) << type;
  }
  auto llama = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64, "vocab_size": 100,
                                 "final_logit_softcapping": 30.0})",
                             "c.json");
  ASSERT_TRUE(llama.ok()) << llama.status();
  EXPECT_EQ(llama->final_logit_softcapping, 0);
  auto gemma3 = ParseHfConfig(R"({"model_type": "gemma3_text", "hidden_size": 64,
                                  "vocab_size": 100, "final_logit_softcapping": 30.0})",
                              "c.json");
  ASSERT_TRUE(gemma3.ok()) << gemma3.status();
  EXPECT_EQ(gemma3->final_logit_softcapping, 30.0);

  auto unknown = ParseHfConfig(R"({"model_type": "cohere\u001b[2J", "hidden_size": 64,
                                   "vocab_size": 100})",
                               "c.json");
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(unknown.status().message());
  EXPECT_NE(msg.find("\"cohere\\u001b[2J\" is not a model family"), std::string::npos) << msg;
  EXPECT_NE(msg.find("olmo2"), std::string::npos) << msg;
}

// Every family of the table (read here from the source tree, as the Python package reads it)
// parses to what the table says; the embedded copy is the file.
TEST(ModelConfigTest, EveryFamilyOfTheSharedTableParsesAsTheTableSays) {
  std::ifstream in(std::string(KJIT_SOURCE_DIR) + "/python/kjit/model_families.json");
  ASSERT_TRUE(in) << "python/kjit/model_families.json";
  std::ostringstream text;
  text << in.rdbuf();
  EXPECT_EQ(ModelFamiliesJson(), text.str()) << "the build embeds a stale copy: reconfigure";
  const nlohmann::json table = nlohmann::json::parse(text.str())["families"];
  ASSERT_GE(table.size(), 32u);
  EXPECT_EQ(ModelFamilyNames().size(), table.size());
  for (const auto& [type, family] : table.items()) {
    auto m =
        ParseHfConfig(fmt::format(R"({{"model_type": "{}", "hidden_size": 64, "vocab_size": 100,
                         "final_logit_softcapping": 5.0}})",
                                  type),
                      "c.json");
    ASSERT_TRUE(m.ok()) << type << ": " << m.status();
    EXPECT_EQ(m->norm_rounds_once, family["norm_casting"] == "gemma") << type;
    EXPECT_EQ(m->norm_weight_offset, family.value("norm_weight_offset", 0.0)) << type;
    EXPECT_EQ(m->final_logit_softcapping, family.value("softcaps_logits", false) ? 5.0 : 0.0)
        << type;
  }
}

TEST(ModelConfigTest, MalformedConfigsSayWhatIsWrong) {
  struct Bad {
    const char* text;
    const char* message;
  };
  for (const Bad& b : std::vector<Bad>{
           {"", "not valid JSON"},
           {"{\"hidden_size\": 4096,", "not valid JSON"},
           {"[1, 2]", "JSON object"},
           {R"({"vocab_size": 32000})", "\"hidden_size\" is missing"},
           {R"({"hidden_size": 4096})", "\"vocab_size\" is missing"},
           {R"({"hidden_size": "4096", "vocab_size": 32000})",
            "\"hidden_size\" must be a positive integer"},
           {R"({"hidden_size": -1, "vocab_size": 32000})",
            "\"hidden_size\" must be a positive integer"},
           {R"({"hidden_size": 4.5, "vocab_size": 32000})",
            "\"hidden_size\" must be a positive integer"},
           {R"({"hidden_size": 4096, "vocab_size": 32000, "rms_norm_eps": "small"})",
            "\"rms_norm_eps\" must be a number"},
           {R"({"hidden_size": 4096, "vocab_size": 32000, "final_logit_softcapping": -3})",
            "\"final_logit_softcapping\" must be a number"},
           {R"({"hidden_size": 4096, "vocab_size": 32000, "model_type": 7})",
            "\"model_type\" must be a string"}}) {
    auto m = ParseHfConfig(b.text, "cfg.json");
    ASSERT_FALSE(m.ok()) << b.text;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << b.text;
    const std::string msg(m.status().message());
    EXPECT_EQ(msg.rfind("cfg.json: ", 0), 0u) << msg;
    EXPECT_NE(msg.find(b.message), std::string::npos) << b.text << " -> " << msg;
  }
  EXPECT_EQ(LoadHfConfig("/nonexistent/config.json").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace kjit::autotune
