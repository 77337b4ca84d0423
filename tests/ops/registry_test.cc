// The op registry: every op's spec survives the JSON the tuner's workers and KJIT_AUTOTUNE pass,
// bad JSON is refused naming the field, and the tuner's questions get each op's own answers.
#include "ops/registry.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "tests/expect_status.h"

namespace kjit::ops {
namespace {

using kjit::testing::ExpectInvalid;

std::vector<OpSpec> Specs() {
  return {RmsNormSpec{.hidden = 3584,
                      .dtype = DType::kF16,
                      .weight_dtype = DType::kF32,
                      .eps = 1e-5f,
                      .weight_offset = 1,
                      .casting = RmsNormCasting::kGemma,
                      .fused_residual = true},
          CrossEntropySpec{.vocab = 256000,
                           .dtype = DType::kBF16,
                           .target_type = IndexType::kInt32,
                           .ignore_index = -1,
                           .reduction = Reduction::kSum,
                           .label_smoothing = 0.1f,
                           .lse_square_scale = 1e-4f,
                           .softcap = 30,
                           .argmax = true}};
}

TEST(Registry, NamesEveryOpOnce) {
  const std::vector<std::string> names = OpNames();
  EXPECT_EQ(names, (std::vector<std::string>{"rms_norm", "cross_entropy"}));
}

TEST(Registry, SpecsRoundTripThroughJson) {
  for (const OpSpec& op : Specs()) {
    const std::string json = SpecToJson(op);
    auto back = SpecFromJson(json);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(SpecToJson(*back), json);
    EXPECT_EQ(back->index(), op.index());
    EXPECT_EQ(TuningShape(*back), TuningShape(op));
  }
}

TEST(Registry, TuningKeysNameTheOptionsThatChangeTheWork) {
  const std::vector<OpSpec> specs = Specs();
  EXPECT_EQ(TuningOp(specs[0]), "rms_norm+residual");
  EXPECT_EQ(TuningShape(specs[0]), "hidden=3584 gemma weight=fp32");
  EXPECT_EQ(TuningOp(specs[1]), "cross_entropy");
  EXPECT_EQ(TuningShape(specs[1]), "vocab=256000 softcap smoothing z_loss argmax");
}

TEST(Registry, BadJsonIsRefusedNamingTheField) {
  ExpectInvalid(SpecFromJson(R"({"op": "layer_norm"})").status(),
                "op: \"layer_norm\" is not one of");
  ExpectInvalid(SpecFromJson("not json").status(), "op spec:");
  ExpectInvalid(SpecFromJson(R"({"op": "rms_norm", "hidden": 4096})").status(), "op spec:");
  std::string json = SpecToJson(Specs()[1]);
  json.replace(json.find("\"sum\""), 5, "\"avg\"");
  ExpectInvalid(SpecFromJson(json).status(), "reduction:");
  json = SpecToJson(RmsNormSpec{.hidden = 4096});
  json.replace(json.find("4096"), 4, "0");
  ExpectInvalid(SpecFromJson(json).status(), "hidden:");
}

TEST(Registry, ConfigsParseForTheirOwnOpOnly) {
  const OpSpec rms = RmsNormSpec{.hidden = 4096};
  const OpSpec ce = CrossEntropySpec{.vocab = 128256};
  auto with = WithConfig(rms, "vec=8 fwd=128x1 bwd=512x1");
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ(std::get<RmsNormSpec>(*with).config->forward.threads_per_row, 128);
  EXPECT_FALSE(WithConfig(ce, "vec=8 fwd=128x1 bwd=512x1").ok());
  EXPECT_TRUE(WithConfig(ce, "vec=8 threads=256 unroll=4 cluster=6 staged=1").ok());
}

TEST(Registry, EachOpAnswersTheTunersQuestions) {
  const OpSpec rms = RmsNormSpec{.hidden = 4096};
  const OpSpec ce = CrossEntropySpec{.vocab = 128256};
  ASSERT_EQ(TunedPasses(ce).size(), 2u);
  EXPECT_EQ(TunedPasses(ce)[1].record_op, "cross_entropy.forward");
  ASSERT_EQ(TunedPasses(rms).size(), 1u);

  const std::string h = "vec=8 fwd=256x1 bwd=512x1";
  EXPECT_EQ(PassesToTime(rms, h, h, Pass::kForwardBackward),
            (std::vector<Pass>{Pass::kForward, Pass::kBackward}));
  EXPECT_EQ(PassesToTime(rms, "vec=8 fwd=128x1 bwd=512x1", h, Pass::kForwardBackward),
            std::vector<Pass>{Pass::kForward});
  EXPECT_EQ(Combine(rms, h, "vec=8 fwd=128x1 bwd=512x1", "vec=8 fwd=256x1 bwd=1024x1"),
            "vec=8 fwd=128x1 bwd=1024x1");
  const std::string ch = "vec=8 threads=256 unroll=4 cluster=6 staged=1";
  EXPECT_EQ(PassesToTime(ce, ch, ch, Pass::kForward), std::vector<Pass>{Pass::kForward});
  EXPECT_EQ(Combine(ce, ch, ch, ch), std::nullopt);

  for (const OpSpec& op : {rms, ce}) {
    const auto space = SearchSpace(op, op.index() == 0 ? h : ch, /*arch=*/90);
    EXPECT_GT(
        std::count_if(space.begin(), space.end(), [](const auto& c) { return c.second.empty(); }),
        5)
        << OpName(op);
  }
}

TEST(Registry, TheHeuristicAndABuildNeedNoGpu) {
  auto rt = Runtime::Create({.target = "sm_90", .compile_only = true, .disk_cache = false});
  ASSERT_TRUE(rt.ok()) << rt.status();
  for (const OpSpec& op : Specs()) {
    auto h = HeuristicConfig(*rt, op);
    ASSERT_TRUE(h.ok()) << h.status();
    auto with = WithConfig(op, *h);
    ASSERT_TRUE(with.ok()) << with.status();
    auto built = Build(*rt, *with);
    ASSERT_TRUE(built.ok()) << built.status();
    EXPECT_EQ(built->target, "sm_90");
    EXPECT_GT(built->bytes, 0u);
    EXPECT_EQ(built->params.at("config"), *h);
  }
}

}  // namespace
}  // namespace kjit::ops
