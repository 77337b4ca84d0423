// The op registry: every op's spec survives the JSON the tuner's workers and KJIT_AUTOTUNE pass,
// bad JSON is refused naming the field, and the tuner's questions get each op's own answers.
#include "ops/registry.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <variant>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jit/status_helpers.h"
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
                           .loss = {.target_type = IndexType::kInt32,
                                    .ignore_index = -1,
                                    .reduction = Reduction::kSum,
                                    .label_smoothing = 0.1f,
                                    .z_loss = 1e-4f,
                                    .softcap = 30,
                                    .argmax = true}},
          RmsNormSpec{.hidden = 4096, .dtype = DType::kBF16, .casting = RmsNormCasting::kNone}};
}

// Generic over the registry, so that a new op (its folder and its OpSpec line) needs no edit here.
TEST(Registry, NamesEveryOpOnce) {
  const std::vector<std::string> names = OpNames();
  EXPECT_EQ(names.size(), std::variant_size_v<OpSpec>);
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a name twice";
  for (const std::string& name : {"rms_norm", "cross_entropy", "linear_cross_entropy"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
  }
  for (const std::string& name : names) {
    auto spec = DefaultSpec(name, DType::kBF16);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    EXPECT_EQ(OpName(*spec), name);
  }
}

// What `kjit-tune --model` tunes follows from each trait's ModelOps; its --casting and
// --class-weights from the traits' flags (the fused op declares --class-weights to be left out).
TEST(Registry, AModelsOpsFollowFromTheTraits) {
  const ModelShape llama{.hidden = 4096, .vocab = 128256, .rms_norm_eps = 1e-5};
  auto ops = ModelOps(llama, DType::kBF16, {});
  ASSERT_TRUE(ops.ok()) << ops.status();
  std::vector<std::string> keys;
  for (const OpSpec& op : *ops) keys.push_back(TuningOp(op) + " " + TuningShape(op));
  EXPECT_EQ(keys, (std::vector<std::string>{"rms_norm hidden=4096", "rms_norm+residual hidden=4096",
                                            "cross_entropy vocab=128256",
                                            "linear_cross_entropy vocab=128256 hidden=4096"}));
  EXPECT_EQ(std::get<RmsNormSpec>(ops->front()).eps, 1e-5f);

  const ModelShape gemma{.hidden = 3584,
                         .vocab = 256000,
                         .final_logit_softcapping = 30,
                         .norm_rounds_once = true,
                         .norm_weight_offset = 1};
  ops = ModelOps(gemma, DType::kBF16,
                 {{"--casting", {.text = "none"}}, {"--class-weights", {.text = "fp32"}}});
  ASSERT_TRUE(ops.ok()) << ops.status();
  keys.clear();
  for (const OpSpec& op : *ops) keys.push_back(TuningOp(op) + " " + TuningShape(op));
  EXPECT_EQ(keys, (std::vector<std::string>{"rms_norm hidden=3584 none",
                                            "rms_norm+residual hidden=3584 none",
                                            "cross_entropy vocab=256000 softcap class_weights"}));
  ExpectInvalid(ModelOps(gemma, DType::kBF16, {{"--casting", {.text = "bogus"}}}).status(),
                "casting");
}

// The CLI's per-op flags are the traits': merged by name, their help naming the ops that take them.
TEST(Registry, CommandFlagsMergeTheOpsFlags) {
  const std::vector<CommandFlag> flags = CommandFlags(FlagCommand::kCompile);
  std::vector<std::string> names;
  for (const CommandFlag& f : flags) names.push_back(f.info.name);
  // Today's ops' flags, in registry order, each once (a new op's own flags may come between).
  const std::vector<std::string> expected = {
      "--hidden",      "--weight-dtype", "--casting",         "--residual", "--vocab",
      "--target-type", "--reduction",    "--label-smoothing", "--z-loss",   "--softcap",
      "--argmax",      "--entropy",      "--class-weights"};
  auto at = names.begin();
  for (const std::string& name : expected) {
    at = std::find(at, names.end(), name);
    ASSERT_NE(at, names.end()) << name << " missing or out of order";
  }
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()).size(), names.size())
      << "a flag twice";
  const CommandFlag& hidden = flags.front();
  ASSERT_EQ(hidden.info.name, "--hidden");
  EXPECT_EQ(hidden.ops.at(0), "rms_norm");
  EXPECT_EQ(hidden.ops.at(1), "linear_cross_entropy");
  EXPECT_EQ(hidden.info.help,
            fmt::format("Hidden size ({}; required)", fmt::join(hidden.ops, ", ")));

  auto spec = DefaultSpec("cross_entropy", DType::kF16);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(ApplyFlag(*spec, FlagCommand::kCompile, "--vocab", {.integer = 1000}).ok());
  ASSERT_TRUE(ApplyFlag(*spec, FlagCommand::kCompile, "--z-loss", {.real = 1e-4f}).ok());
  EXPECT_EQ(TuningShape(*spec), "vocab=1000 z_loss");
  EXPECT_TRUE(ValidateSpec(*spec).ok());
  ExpectInvalid(ApplyFlag(*spec, FlagCommand::kCompile, "--casting", {.text = "gemma"}),
                "--casting does not apply to --op cross_entropy");
  ExpectInvalid(DefaultSpec("nope", DType::kF16).status(), "op: \"nope\" is not one of");
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
  EXPECT_EQ(TuningShape(specs[2]), "hidden=4096 none");
  EXPECT_NE(SpecToJson(specs[2]).find(R"("casting":"none")"), std::string::npos)
      << SpecToJson(specs[2]);
}

TEST(Registry, BadJsonIsRefusedNamingTheField) {
  ExpectInvalid(SpecFromJson(R"({"op": "layer_norm"})").status(),
                "op: \"layer_norm\" is not one of");
  ExpectInvalid(SpecFromJson("not json").status(), "op spec:");
  ExpectInvalid(SpecFromJson(R"({"op": "rms_norm", "hidden": 4096})").status(),
                "dtype: is missing");
  ExpectInvalid(SpecFromJson("[1, 2]").status(), "op spec: must be a JSON object, got an array");
  ExpectInvalid(SpecFromJson(R"({"op": 3})").status(), "op: must be a string, got 3");
  std::string json = SpecToJson(Specs()[1]);
  json.replace(json.find("\"sum\""), 5, "\"avg\"");
  ExpectInvalid(SpecFromJson(json).status(), "reduction:");
  json = SpecToJson(RmsNormSpec{.hidden = 4096});
  json.replace(json.find("4096"), 4, "0");
  ExpectInvalid(SpecFromJson(json).status(), "hidden:");
}

// A spec's JSON with one field's value replaced by `value` (JSON text).
std::string WithField(const OpSpec& op, const std::string& field, const std::string& value) {
  nlohmann::json j = nlohmann::json::parse(SpecToJson(op));
  j[field] = nlohmann::json::parse(value);
  return j.dump();
}

// Issue 18, defect 8: nlohmann's get<int64_t>() truncated 4096.5 to 4096, wrapped 1e20 and 2^64-1,
// and said "type must be number, but is string" without the field.
TEST(Registry, SpecNumbersAreCheckedAndTheFieldNamed) {
  const OpSpec rms = RmsNormSpec{.hidden = 4096};
  const OpSpec ce = CrossEntropySpec{.vocab = 128256};
  const struct {
    OpSpec op;
    std::string field, value, message;
  } cases[] = {
      {rms, "hidden", "4096.5", "hidden: 4096.5 is not an integer"},
      {rms, "hidden", "4096.0", "hidden: 4096.0 is not an integer"},
      {ce, "vocab", "1e20", "vocab: 1e+20 is not an integer"},
      {ce, "vocab", "18446744073709551615", "vocab: 18446744073709551615 is out of range"},
      {ce, "vocab", "9223372036854775807", "vocab: 9223372036854775807 is out of range, expected"},
      {ce, "vocab", R"("x")", R"(vocab: must be a number, got "x")"},
      {ce, "vocab", "[128256]", "vocab: must be a number, got an array"},
      {ce, "ignore_index", "-1.5", "ignore_index: -1.5 is not an integer"},
      {ce, "ignore_index", "true", "ignore_index: must be a number, got true"},
      {ce, "softcap", "1e300", "softcap: 1e+300 is out of range"},
      {ce, "softcap", R"("30")", R"(softcap: must be a number, got "30")"},
      {ce, "label_smoothing", "1", "label_smoothing: 1 must be in [0, 1)"},
      {ce, "argmax", "1", "argmax: must be true or false, got 1"},
      {ce, "reduction", "0", "reduction: must be a string, got 0"},
      {rms, "eps", "null", "eps: must be a number, got null"},
      {rms, "fused_residual", R"("yes")", R"(fused_residual: must be true or false, got "yes")"},
      {rms, "weight_dtype", R"("bf17")", "weight_dtype: \"bf17\" is not supported"},
      {rms, "vocab", "1000", "vocab: is not a field of rms_norm (its fields: op, "},
      {rms, "casting", R"("t5")", "casting: 't5' is not a casting (llama, gemma, none)"},
      {rms, "casting", "true", "casting: must be a string, got true"},
      {rms, "gemma_casting", "true", "gemma_casting: is not a field of rms_norm"},
  };
  for (const auto& c : cases) {
    const std::string json = WithField(c.op, c.field, c.value);
    ExpectInvalid(SpecFromJson(json).status(), c.message);
  }
  // What fits is taken as written: an integer-valued float field, a float written as an integer.
  auto ok = SpecFromJson(WithField(ce, "softcap", "30"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(std::get<CrossEntropySpec>(*ok).loss.softcap, 30.0f);
  ok = SpecFromJson(WithField(ce, "ignore_index", "-9223372036854775808"));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(std::get<CrossEntropySpec>(*ok).loss.ignore_index, INT64_MIN);
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

// Issue 34 (5): bf16 below sm_80 went to NVRTC and came back as INTERNAL with 13.6 KB of ptxas
// output. Every op refuses it as it is made, naming the field, before any compile; fp16 builds.
TEST(Registry, Bf16BelowSm80IsRefusedAsTheOpIsMade) {
  auto rt = Runtime::Create({.target = "sm_75", .compile_only = true, .disk_cache = false});
  ASSERT_TRUE(rt.ok()) << rt.status();
  const std::string why = ": bf16 needs sm_80 or newer, the target is sm_75; use fp16 or fp32";
  for (const std::string& name : OpNames()) {
    auto spec = BenchSpec(name, 64, DType::kBF16);
    ASSERT_TRUE(spec.ok()) << spec.status();
    const absl::Status built = Build(*rt, *spec).status();
    EXPECT_EQ(built.code(), absl::StatusCode::kInvalidArgument) << name << ": " << built;
    EXPECT_EQ(ToStd(built.message()), "dtype" + why) << name;
  }
  const absl::Status weight =
      rt->RmsNorm({.hidden = 64, .dtype = DType::kF32, .weight_dtype = DType::kBF16}).status();
  EXPECT_EQ(ToStd(weight.message()), "weight_dtype" + why) << weight;
  const absl::Status sharded =
      rt->ShardedCrossEntropy({.vocab = 64, .shard_start = 0, .shard_end = 32}).status();
  EXPECT_EQ(ToStd(sharded.message()), "dtype" + why) << sharded;
  auto fp16 = Build(*rt, RmsNormSpec{.hidden = 64, .dtype = DType::kF16});
  ASSERT_TRUE(fp16.ok()) << fp16.status();
  EXPECT_EQ(fp16->target, "sm_75");
}

// Issue 34 (12): kjit_c.h showed the lm_head config "chunk=1024 streams=1 ..." without whole=,
// which the parser refuses. Every config written out in the public headers, the README and the
// Python package's docstrings ("name=value name=value ...", quoted) parses for one of the ops.
TEST(Registry, TheConfigExamplesOfTheDocsParse) {
  std::vector<OpSpec> ops;  // every op, at a size its examples fit (a new op's header has some)
  for (const std::string& name : OpNames()) {
    auto spec = BenchSpec(name, BenchSizeName(name) == "hidden" ? 4096 : 128256, DType::kBF16);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    ops.push_back(*spec);
  }
  const std::string root = KJIT_SOURCE_DIR;
  std::vector<std::string> files = {root + "/README.md", root + "/python/kjit/_runtime.py"};
  for (const auto& e : std::filesystem::directory_iterator(root + "/include/kjit")) {
    files.push_back(e.path().string());
  }
  const std::regex quoted_config(R"re("([a-z_]+=[^" \n]*(?: [^" \n]+)+)")re");
  int examples = 0;
  for (const std::string& file : files) {
    std::ifstream in(file);
    ASSERT_TRUE(in) << file;
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (std::sregex_iterator m(text.begin(), text.end(), quoted_config), end; m != end; ++m) {
      const std::string config = (*m)[1];
      ++examples;
      std::string errors;
      bool parsed = false;
      for (const OpSpec& op : ops) {
        const absl::Status s = WithConfig(op, config).status();
        parsed |= s.ok();
        errors += fmt::format("\n  {}: {}", OpName(op), ToStd(s.message()));
      }
      EXPECT_TRUE(parsed) << file << ": \"" << config << "\" parses for no op:" << errors;
    }
  }
  EXPECT_GE(examples, 8) << "the examples were not found";
}

}  // namespace
}  // namespace kjit::ops
