// NVRTC compiles of the cross-entropy template on the CPU: every dtype x arch x a few vocab sizes
// (odd ones included), every option, narrow vectors for misaligned views, and `kjit compile --op
// cross_entropy` end to end.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jit/compiler.h"
#include "jit/embedded_templates.h"
#include "jit/jit.h"
#include "kjit/cross_entropy.h"
#include "kjit/linear_cross_entropy.h"
#include "kjit/sharded_cross_entropy.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/program.h"
#include "ops/linear_cross_entropy/program.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

const jit::Nvrtc& GetNvrtc() {
  auto n = jit::Nvrtc::Get();
  EXPECT_TRUE(n.ok()) << n.status();  // NVRTC is part of the CI machine's toolkit
  return **n;
}

// A memory-only JIT for the compiles here: an op's programs compile in parallel (BuildAll, as a
// launch's do), and the configs that share a kernel (count, reduce) compile it once.
jit::Jit& SharedJit() {
  static jit::Jit* jit = [] {
    auto made = jit::Jit::Create({.use_disk_cache = false});
    EXPECT_TRUE(made.ok()) << made.status();
    return made.ok() ? made->release() : nullptr;
  }();
  return *jit;
}

// Every program the op's launches may load for `config` (one kernel each) compiles to a CUBIN.
void ExpectCompiles(const CrossEntropySpec& spec, const CrossEntropyConfig& config,
                    const char* arch) {
  auto programs = ops::RenderCrossEntropyPrograms(spec, config);
  ASSERT_TRUE(programs.ok()) << programs.status();
  ASSERT_EQ(programs->size(), 5u);
  const jit::Target target = *jit::ParseTarget(arch);
  auto built = SharedJit().BuildAll(*programs, target);
  ASSERT_TRUE(built.ok()) << arch << " " << jit::FormatParams((*programs)[0].params) << ": "
                          << built.status();
  ASSERT_EQ(built->size(), programs->size());
  for (size_t i = 0; i < built->size(); ++i) {
    const jit::Binary& bin = *(*built)[i].binary;
    EXPECT_EQ(bin.program_name, (*programs)[i].name);
    EXPECT_EQ(bin.target, target);
    ASSERT_GE(bin.code.size(), 4u);
    EXPECT_EQ(bin.code.substr(0, 4),
              "\x7f"
              "ELF")
        << "CUBIN is an ELF image";
    ASSERT_EQ(bin.lowered_names.size(), (*programs)[i].name_expressions.size());
    for (const auto& [expr, lowered] : bin.lowered_names) {
      EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr << " -> " << lowered;
    }
  }
}

TEST(CrossEntropyCompileTest, TemplatesAreEmbeddedAndUseNoToolkitHeader) {
  for (const char* name : {"cross_entropy.cuh", "cross_entropy_params.h"}) {
    const std::string* text = jit::FindEmbeddedTemplate(name);
    ASSERT_NE(text, nullptr) << name;
    EXPECT_EQ(text->find("#include <"), std::string::npos) << name << " includes a system header";
    EXPECT_EQ(text->find("#include \"cuda"), std::string::npos)
        << name << " includes a toolkit header";
  }
}

TEST(CrossEntropyCompileTest, EveryDtypeArchAndVocab) {
  int compiled = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int64_t vocab : {2, 3, 50257, 128256}) {
        const CrossEntropySpec spec{.vocab = vocab, .dtype = t};
        const int vec = ops::MaxVecForCrossEntropy(static_cast<int>(SizeOf(t)));
        const int cc = std::stoi(std::string(arch).substr(3));
        ExpectCompiles(spec,
                       ops::DefaultCrossEntropyConfig(vocab, vec, cc, static_cast<int>(SizeOf(t))),
                       arch);
        if (::testing::Test::HasFatalFailure()) return;
        ++compiled;
      }
    }
  }
  EXPECT_EQ(compiled, 4 * 3 * 4);
}

// Options are template flags: cover each alone and together, both index types, every reduction,
// and the narrow vectors misaligned views fall back to.
TEST(CrossEntropyCompileTest, EveryOptionAndLaunchShape) {
  for (int bits = 0; bits < 16; ++bits) {
    CrossEntropySpec spec{.vocab = 1000, .dtype = DType::kBF16};
    if (bits & 1) spec.loss.label_smoothing = 0.1f;
    if (bits & 2) spec.loss.z_loss = 1e-4f;
    if (bits & 4) spec.loss.softcap = 30.0f;
    spec.loss.argmax = (bits & 8) != 0;
    // Index type and reduction vary along with the flags: each value meets options on and off.
    spec.loss.target_type = __builtin_popcount(bits) % 2 ? IndexType::kInt32 : IndexType::kInt64;
    spec.loss.reduction = static_cast<Reduction>(bits % 3);
    SCOPED_TRACE(bits);
    ExpectCompiles(spec, ops::DefaultCrossEntropyConfig(1000, 8, 90, 2), "sm_90");
    if (::testing::Test::HasFatalFailure()) return;
  }
  for (const CrossEntropyConfig& c :
       {CrossEntropyConfig{.vec = 1, .threads = 32, .unroll = 8},
        CrossEntropyConfig{.vec = 2, .threads = 96, .unroll = 1},
        CrossEntropyConfig{.vec = 4, .threads = 1024, .unroll = 2},
        CrossEntropyConfig{.vec = 8, .threads = 1024, .unroll = 4, .cluster = 8},
        CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 4, .cluster = 8},
        CrossEntropyConfig{.vec = 8, .threads = 128, .unroll = 4, .cluster = 3, .staged = 1}}) {
    ExpectCompiles({.vocab = 262144, .dtype = DType::kF16, .loss = {.argmax = true}}, c, "sm_100");
    if (::testing::Test::HasFatalFailure()) return;
  }
  // The entropy accumulator in each of the fused op's kernels and the forward.
  for (const CrossEntropyConfig& c :
       {CrossEntropyConfig{.vec = 2, .threads = 96, .unroll = 1},
        CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 4, .cluster = 3},
        CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 4, .cluster = 2, .staged = 1}}) {
    ExpectCompiles(
        {.vocab = 50257,
         .dtype = DType::kBF16,
         .loss = {.label_smoothing = 0.1f, .softcap = 30.0f, .argmax = true, .entropy = true}},
        c, "sm_90");
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Staged with a vocab that is not a multiple of the vector: the last block's scalar tail.
  ExpectCompiles(
      {.vocab = 50257, .dtype = DType::kBF16, .loss = {.label_smoothing = 0.1f, .softcap = 30.0f}},
      CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 4, .cluster = 2, .staged = 1},
      "sm_90");
  ExpectCompiles({.vocab = 1 << 20, .dtype = DType::kF32},
                 ops::DefaultCrossEntropyConfig(1 << 20, 4, 120, 4), "sm_120");
}

// Issue 45, defect 13: -0 is the option off, as 0: the same programs, the same cache entries.
TEST(CrossEntropyCompileTest, NegativeZeroOptionsAreKeyedAsZero) {
  CrossEntropySpec zero{.vocab = 50257}, minus = zero;
  minus.loss.label_smoothing = -0.0f;
  minus.loss.z_loss = -0.0f;
  minus.loss.softcap = -0.0f;
  const CrossEntropyConfig config = ops::DefaultCrossEntropyConfig(50257, 8, 90, 2);
  auto a = ops::RenderCrossEntropyPrograms(zero, config);
  auto b = ops::RenderCrossEntropyPrograms(minus, config);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].text, (*b)[i].text);
    EXPECT_EQ((*a)[i].params, (*b)[i].params);
  }
}

// Issue 45, defect 13: label smoothing, z-loss and softcap are compiled on or off; their values are
// launch arguments, so specs that differ only in them render the same programs (the same cache
// keys) in the plain, sharded and lm_head ops, while the op's own params still say the values.
TEST(CrossEntropyCompileTest, LossOptionValuesAreLaunchArgumentsNotKeys) {
  CrossEntropySpec first{.vocab = 50257,
                         .loss = {.label_smoothing = 0.1f, .z_loss = 1e-4f, .softcap = 30.0f}};
  CrossEntropySpec second = first, off = first;
  second.loss.label_smoothing = 0.2f;
  second.loss.z_loss = 2e-4f;
  second.loss.softcap = 20.0f;
  off.loss.label_smoothing = 0;
  const CrossEntropyConfig config = ops::DefaultCrossEntropyConfig(50257, 8, 90, 2);
  auto a = ops::RenderCrossEntropyPrograms(first, config);
  auto b = ops::RenderCrossEntropyPrograms(second, config);
  auto c = ops::RenderCrossEntropyPrograms(off, config);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) {
    EXPECT_EQ((*a)[i].text, (*b)[i].text);
    EXPECT_EQ((*a)[i].params, (*b)[i].params);
    EXPECT_NE((*a)[i].text, (*c)[i].text) << "smoothing on or off is compiled";
  }
  EXPECT_EQ((*a)[0].params.at("label_smoothing"), "on");
  EXPECT_EQ((*c)[0].params.at("label_smoothing"), "0");
  EXPECT_EQ(ops::CrossEntropyParams(second).at("label_smoothing"), "0.2");
  EXPECT_EQ(ops::CrossEntropyParams(second).at("softcap"), "20");

  ShardedCrossEntropySpec sharded_first{
      .vocab = 50257, .shard_start = 0, .shard_end = 25129, .loss = first.loss};
  ShardedCrossEntropySpec sharded_second = sharded_first;
  sharded_second.loss = second.loss;
  const auto sharded_config = ops::DefaultShardedCrossEntropyConfig(25129, 8);
  auto sa = ops::RenderShardedCrossEntropy(sharded_first, sharded_config);
  auto sb = ops::RenderShardedCrossEntropy(sharded_second, sharded_config);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_EQ(sa->text, sb->text);

  LinearCrossEntropySpec head_first{.vocab = 50257, .hidden = 1024, .loss = first.loss};
  LinearCrossEntropySpec head_second = head_first;
  head_second.loss = second.loss;
  auto ha = ops::RenderLinearCrossEntropy(head_first);
  auto hb = ops::RenderLinearCrossEntropy(head_second);
  ASSERT_TRUE(ha.ok() && hb.ok());
  EXPECT_EQ(ha->text, hb->text);
  auto chunk_a = ops::RenderCrossEntropyPrograms(head_first.ChunkLoss(), config);
  auto chunk_b = ops::RenderCrossEntropyPrograms(head_second.ChunkLoss(), config);
  ASSERT_TRUE(chunk_a.ok() && chunk_b.ok());
  for (size_t i = 0; i < chunk_a->size(); ++i) EXPECT_EQ((*chunk_a)[i].text, (*chunk_b)[i].text);
}

// A cluster compiled for a GPU without clusters is refused by the template, with a reason.
TEST(CrossEntropyCompileTest, ClustersBeforeSm90FailWithTheReason) {
  auto src = ops::RenderCrossEntropy({.vocab = 128256},
                                     CrossEntropyConfig{.vec = 8, .threads = 512, .cluster = 4},
                                     ops::CrossEntropyProgram::kForwardBackward);
  ASSERT_TRUE(src.ok()) << src.status();
  auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget("sm_80"));
  ASSERT_FALSE(bin.ok());
  EXPECT_NE(std::string(bin.status().message()).find("needs sm_90 or newer"), std::string::npos)
      << bin.status();
}

TEST(CrossEntropyCompileTest, StagedBeforeSm90FailsWithTheReason) {
  auto src = ops::RenderCrossEntropy(
      {.vocab = 32000}, CrossEntropyConfig{.vec = 8, .threads = 256, .cluster = 1, .staged = 1},
      ops::CrossEntropyProgram::kForwardBackward);
  ASSERT_TRUE(src.ok()) << src.status();
  auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget("sm_80"));
  ASSERT_FALSE(bin.ok());
  EXPECT_NE(std::string(bin.status().message()).find("need sm_90 or newer"), std::string::npos)
      << bin.status();
}

// `kjit compile --op cross_entropy` without a GPU; the size flag is checked per op.
class CrossEntropyCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
  }

  struct Result {
    int exit_code = -1;
    std::string output;  // stdout and stderr
  };
  Result Run(const std::string& args) const {
    const std::string cmd =
        fmt::format("KJIT_CACHE_DIR={}/cache {} {} 2>&1", dir_, KJIT_CLI_PATH, args);
    Result r;
    FILE* p = popen(cmd.c_str(), "r");
    if (p == nullptr) return r;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
    const int status = pclose(p);
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return r;
  }
  testing::TempDir tmp_{"kjit_ce_cli"};
  std::string dir_;
};

TEST_F(CrossEntropyCliTest, CompilesEveryDtypeForAnExplicitArch) {
  for (const char* dtype : {"bf16", "fp16", "fp32"}) {
    const Result r = Run(fmt::format(
        "compile --op cross_entropy --vocab 128256 --dtype {} --arch sm_100 --json", dtype));
    EXPECT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("\"target\": \"sm_100\""), std::string::npos) << r.output;
    EXPECT_NE(r.output.find("\"vocab\": \"128256\""), std::string::npos) << r.output;
  }
  const Result options =
      Run("compile --op cross_entropy --vocab 50257 --target-type int32 --reduction none "
          "--label-smoothing 0.1 --z-loss 1e-4 --softcap 30 --argmax --arch sm_90");
  EXPECT_EQ(options.exit_code, 0) << options.output;
  EXPECT_NE(options.output.find("softcap=30"), std::string::npos) << options.output;
  const Result weighted =
      Run("compile --op cross_entropy --vocab 50257 --label-smoothing 0.1 --class-weights bf16 "
          "--arch sm_90");
  EXPECT_EQ(weighted.exit_code, 0) << weighted.output;
  EXPECT_NE(weighted.output.find("class_weight_dtype=bf16"), std::string::npos) << weighted.output;
}

// `kjit compile` prebuilds every program a launch may load, so that the first launch of any kind
// in a new process is a cache hit; it reports each of them.
TEST_F(CrossEntropyCliTest, CompilePrebuildsAndReportsEveryProgram) {
  const std::string args = "compile --op cross_entropy --vocab 1000 --arch sm_90 --json";
  std::map<std::string, std::string> keys;  // program -> key
  for (const char* origin : {"compiled", "disk cache"}) {
    const Result r = Run(args);
    ASSERT_EQ(r.exit_code, 0) << r.output;
    const nlohmann::json j = nlohmann::json::parse(r.output, nullptr, /*allow_exceptions=*/false);
    ASSERT_TRUE(j.is_array() && j.size() == 1u) << r.output;
    const nlohmann::json& e = j[0];
    EXPECT_EQ(e["origin"], origin) << r.output;
    const nlohmann::json& programs = e["programs"];
    ASSERT_TRUE(programs.is_array() && programs.size() == 5u) << r.output;
    EXPECT_EQ(programs[0]["program"], "cross_entropy.forward_backward");
    EXPECT_EQ(programs[0]["key"], e["key"]);
    std::set<std::string> kernels;
    for (const nlohmann::json& p : programs) {
      const std::string name = p["program"].get<std::string>();
      EXPECT_EQ(p["origin"], origin) << name;
      for (const nlohmann::json& k : p["kernels"]) kernels.insert(k.get<std::string>());
      EXPECT_EQ(p["path"], fmt::format("{}/cache/{}.kjit", dir_, p["key"].get<std::string>()));
      EXPECT_TRUE(std::filesystem::is_regular_file(p["path"].get<std::string>())) << name;
      if (keys.count(name)) {
        EXPECT_EQ(keys[name], p["key"]) << name;
      }
      keys[name] = p["key"].get<std::string>();
    }
    EXPECT_EQ(kernels.size(), 6u) << "count, forward, forward+backward, backward, rescale, reduce";
  }
  EXPECT_EQ(keys.size(), 5u);
  size_t entries = 0;
  for (const auto& f : std::filesystem::directory_iterator(dir_ + "/cache")) {
    entries += f.path().extension() == ".kjit";
  }
  EXPECT_EQ(entries, 5u);
  // The text report lists them too, one line each.
  const Result text = Run("compile --op cross_entropy --vocab 1000 --arch sm_90");
  ASSERT_EQ(text.exit_code, 0) << text.output;
  for (const auto& [name, key] : keys) {
    EXPECT_NE(text.output.find(fmt::format("  program {} {} (disk cache, ", name, key)),
              std::string::npos)
        << text.output;
  }
}

// Issue 45, defect 13: a schedule of option values (smoothing 0.1, then 0.2) compiles once; the
// second compile finds every program in the cache, and its report says the values it was given.
TEST_F(CrossEntropyCliTest, NewOptionValuesReuseTheCachedPrograms) {
  const Result first =
      Run("compile --op cross_entropy --vocab 1000 --arch sm_90 --label-smoothing 0.1 "
          "--z-loss 1e-4 --softcap 30 --json");
  ASSERT_EQ(first.exit_code, 0) << first.output;
  EXPECT_NE(first.output.find("\"origin\": \"compiled\""), std::string::npos) << first.output;
  const Result second =
      Run("compile --op cross_entropy --vocab 1000 --arch sm_90 --label-smoothing 0.2 "
          "--z-loss 2e-4 --softcap 20 --json");
  ASSERT_EQ(second.exit_code, 0) << second.output;
  const nlohmann::json j = nlohmann::json::parse(second.output, nullptr, false);
  ASSERT_TRUE(j.is_array() && j.size() == 1u) << second.output;
  EXPECT_EQ(j[0]["origin"], "disk cache") << second.output;
  for (const nlohmann::json& p : j[0]["programs"]) EXPECT_EQ(p["origin"], "disk cache") << p;
  EXPECT_NE(second.output.find("\"label_smoothing\": \"0.2\""), std::string::npos) << second.output;
}

TEST_F(CrossEntropyCliTest, SizeFlagsAreCheckedPerOp) {
  Result r = Run("compile --op cross_entropy --arch sm_90");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--vocab is required"), std::string::npos) << r.output;
  r = Run("compile --op rms_norm --arch sm_90");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--hidden is required"), std::string::npos) << r.output;
  r = Run("compile --op cross_entropy --vocab 1000 --hidden 64 --arch sm_90");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--hidden does not apply"), std::string::npos) << r.output;
  r = Run("compile --op cross_entropy --vocab 1 --arch sm_90");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("--vocab"), std::string::npos) << r.output;
  r = Run("compile --op cross_entropy --vocab 1000 --label-smoothing 1.5 --arch sm_90");
  EXPECT_EQ(r.exit_code, 2) << r.output;  // a usage error, named by its flag
  EXPECT_NE(r.output.find("--label-smoothing"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace kjit
