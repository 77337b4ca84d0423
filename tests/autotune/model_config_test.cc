// Model presets and the Hugging Face config.json reader behind `kjit-tune --model/--config`.
#include "autotune/model_config.h"

#include <gtest/gtest.h>

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
  EXPECT_FALSE(llama->gemma_norm);
  auto gemma = ModelPreset("gemma-2-9b");
  EXPECT_EQ(gemma->hidden_size, 3584);
  EXPECT_EQ(gemma->vocab_size, 256000);
  EXPECT_TRUE(gemma->gemma_norm);
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
  EXPECT_TRUE(m->gemma_norm);
  EXPECT_DOUBLE_EQ(m->final_logit_softcapping, 30.0);

  // Optional fields absent or null; a multimodal checkpoint's text_config.
  auto plain = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 2048, "vocab_size": 128256,
                                 "final_logit_softcapping": null})",
                             "a.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->gemma_norm);
  EXPECT_EQ(plain->final_logit_softcapping, 0);
  EXPECT_EQ(plain->name, "a.json");
  auto nested =
      ParseHfConfig(R"({"text_config": {"hidden_size": 5120, "vocab_size": 131072}})", "b");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->hidden_size, 5120);
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
            "\"final_logit_softcapping\" must be a number"}}) {
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
