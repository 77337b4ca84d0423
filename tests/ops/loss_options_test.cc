// The loss options shared by every loss op: one validation, one JSON reader and writer, one set of
// tuning words, whatever op holds them.
#include <string>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "jit/status_helpers.h"
#include "kjit/kjit.h"
#include "ops/common/loss_options.h"
#include "ops/registry.h"
#include "tests/expect_status.h"

namespace kjit::ops {
namespace {

using testing::ExpectInvalid;

const LossOptions kEveryOption{.target_type = IndexType::kInt32,
                               .ignore_index = -1,
                               .reduction = Reduction::kSum,
                               .label_smoothing = 0.25f,
                               .z_loss = 1e-4f,
                               .softcap = 30,
                               .argmax = true,
                               .entropy = true,
                               .class_weight_dtype = DType::kF32};

TEST(LossOptions, EveryLossOpValidatesThemAlike) {
  const LossOptions bad{.z_loss = -1};
  ExpectInvalid(ValidateLossOptions(bad, DType::kBF16), "z_loss:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = bad}), "z_loss:");
  ExpectInvalid(ValidateLinearCrossEntropySpec({.vocab = 8, .hidden = 4, .loss = bad}), "z_loss:");
  ExpectInvalid(
      ValidateShardedCrossEntropySpec({.vocab = 8, .shard_start = 0, .shard_end = 4, .loss = bad}),
      "z_loss:");
  ExpectInvalid(ValidateLossOptions({.class_weight_dtype = DType::kF16}, DType::kBF16),
                "class_weight_dtype:");
  EXPECT_TRUE(ValidateLossOptions(kEveryOption, DType::kBF16).ok());
}

TEST(LossOptions, TheShardedOpRefusesThePerRowOutputsItCannotReduce) {
  ShardedCrossEntropySpec s{.vocab = 8, .shard_start = 0, .shard_end = 4};
  EXPECT_TRUE(ValidateShardedCrossEntropySpec(s).ok());
  s.loss.argmax = true;
  ExpectInvalid(ValidateShardedCrossEntropySpec(s), "argmax:");
  s.loss = {.entropy = true};
  ExpectInvalid(ValidateShardedCrossEntropySpec(s), "entropy:");
}

TEST(LossOptions, EveryLossOpWritesAndReadsThemUnderOneName) {
  const std::vector<OpSpec> specs = {
      CrossEntropySpec{.vocab = 128, .dtype = DType::kBF16, .loss = kEveryOption},
      LinearCrossEntropySpec{.vocab = 128, .hidden = 64, .loss = kEveryOption}};
  for (const OpSpec& spec : specs) {
    const nlohmann::json j = nlohmann::json::parse(SpecToJson(spec));
    EXPECT_EQ(j.at("z_loss"), 1e-4f) << j;
    EXPECT_FALSE(j.contains("lse_square_scale")) << j;
    auto back = SpecFromJson(j.dump());
    ASSERT_TRUE(back.ok()) << back.status();
    if (const auto* ce = std::get_if<CrossEntropySpec>(&*back)) EXPECT_EQ(ce->loss, kEveryOption);
    if (const auto* lce = std::get_if<LinearCrossEntropySpec>(&*back)) {
      EXPECT_EQ(lce->loss, kEveryOption);
    }
    EXPECT_EQ(back->index(), spec.index());
  }
}

TEST(LossOptions, TheCoefficientsOldNameIsReadButNotWithTheNewOne) {
  nlohmann::json j = nlohmann::json::parse(SpecToJson(CrossEntropySpec{.vocab = 128}));
  j.erase("z_loss");
  j["lse_square_scale"] = 0.5;  // a spec written before the options were one struct
  auto old = SpecFromJson(j.dump());
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ(std::get<CrossEntropySpec>(*old).loss.z_loss, 0.5f);
  j["z_loss"] = 0.5;
  ExpectInvalid(SpecFromJson(j.dump()).status(), "z_loss:");
}

// Issue 45, defect 12: a spec's number that a float cannot hold as given was refused as the float
// it became ("label_smoothing: 1 must be in [0, 1)" of 0.9999999999); the message says both, as
// `kjit compile`'s flags do. A value the float holds as given is quoted as before.
TEST(LossOptions, ASpecsNumberThatAFloatChangesIsQuotedAsGiven) {
  const auto message = [](const std::string& op, const char* field, double value) {
    nlohmann::json j = nlohmann::json::parse(
        op == "log_probs" ? SpecToJson(LogProbsSpec{.vocab = 128})
        : op == "lm_head" ? SpecToJson(LinearCrossEntropySpec{.vocab = 128, .hidden = 64})
                          : SpecToJson(CrossEntropySpec{.vocab = 128}));
    j[field] = value;
    return std::string(ToStd(SpecFromJson(j.dump()).status().message()));
  };
  for (const char* op : {"cross_entropy", "lm_head"}) {
    EXPECT_EQ(message(op, "label_smoothing", 0.9999999999),
              "label_smoothing: 0.9999999999 (1 as a float) must be in [0, 1)")
        << op;
    EXPECT_EQ(message(op, "label_smoothing", 1.5), "label_smoothing: 1.5 must be in [0, 1)") << op;
  }
  EXPECT_EQ(message("log_probs", "temperature", 1e-46),
            "temperature: 1e-46 (0 as a float) must be a finite number > 0");
  EXPECT_EQ(message("log_probs", "temperature", -0.5),
            "temperature: -0.5 must be a finite number > 0");
  // Beyond a float's range: refused by the reader, with the value given.
  EXPECT_EQ(message("cross_entropy", "softcap", 1e39), "softcap: 1e+39 is out of range");
}

TEST(LossOptions, TuningWordsNameEachOptionThatAddsWorkAndReadBack) {
  const TuningShapeWords words = TuningShapeWords::Parse("vocab=8" + LossTuningWords(kEveryOption));
  const LossOptions back = LossFromTuningWords(words, DType::kBF16);
  EXPECT_EQ(LossTuningWords(back), LossTuningWords(kEveryOption));
  EXPECT_TRUE(back.entropy);
  EXPECT_EQ(LossTuningWords({}), "");
}

}  // namespace
}  // namespace kjit::ops
