// CrossEntropy without a GPU: spec and config validation, the launch heuristic, rendering, and
// argument checks through a compile-only runtime (each bad argument is named, and nothing reaches a
// launch).
#include "kjit/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/runtime.h"
#include "ops/cross_entropy/config.h"
#include "ops/cross_entropy/program.h"
#include "templates/cross_entropy_params.h"
#include "tests/expect_status.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;

TEST(CrossEntropySpecTest, RejectsBadSpecsNamingTheField) {
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 0}), "vocab:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 1}), "vocab:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = (1 << 20) + 1}), "vocab:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.label_smoothing = -0.1f}}),
                "label_smoothing:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.label_smoothing = 1.0f}}),
                "label_smoothing:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.label_smoothing = NAN}}),
                "label_smoothing:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.z_loss = -1e-4f}}), "z_loss:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.z_loss = INFINITY}}), "z_loss:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.softcap = -30.0f}}), "softcap:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.softcap = NAN}}), "softcap:");
  ExpectInvalid(ValidateCrossEntropySpec({.vocab = 8, .loss = {.softcap = INFINITY}}), "softcap:");
  ExpectInvalid(ValidateCrossEntropySpec(
                    {.vocab = 8,
                     .loss = {.target_type = IndexType::kInt32, .ignore_index = int64_t{1} << 40}}),
                "ignore_index:");
  ExpectInvalid(
      ValidateCrossEntropySpec(
          {.vocab = 8, .dtype = DType::kBF16, .loss = {.class_weight_dtype = DType::kF16}}),
      "class_weight_dtype: fp16 must be fp32 or the logits' dtype (bf16)");
  EXPECT_TRUE(
      ValidateCrossEntropySpec({.vocab = 8, .loss = {.class_weight_dtype = DType::kF32}}).ok());
  EXPECT_TRUE(ValidateCrossEntropySpec(
                  {.vocab = 8, .dtype = DType::kF16, .loss = {.class_weight_dtype = DType::kF16}})
                  .ok());
  EXPECT_TRUE(ValidateCrossEntropySpec({.vocab = 2}).ok());
  EXPECT_TRUE(ValidateCrossEntropySpec({.vocab = 1 << 20}).ok());
  EXPECT_TRUE(ValidateCrossEntropySpec(
                  {.vocab = 8,
                   .loss = {.target_type = IndexType::kInt64, .ignore_index = int64_t{1} << 40}})
                  .ok());
  EXPECT_TRUE(ValidateCrossEntropySpec({.vocab = 50257,
                                        .loss = {.ignore_index = 3,  // a class may be ignored
                                                 .label_smoothing = 0.999f,
                                                 .z_loss = 1e-4f,
                                                 .softcap = 30.0f}})
                  .ok());
  // The Runtime refuses the same specs before compiling anything.
  auto rt = Runtime::Create({.target = "sm_90", .compile_only = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto ce = rt->CrossEntropy({.vocab = 1});
  ASSERT_FALSE(ce.ok());
  ExpectInvalid(ce.status(), "vocab:");
}

TEST(CrossEntropySpecTest, RejectsBadConfigs) {
  CrossEntropySpec s{.vocab = 32000};
  s.config = ops::DefaultCrossEntropyConfig(32000, 8, 90, 2);
  EXPECT_TRUE(ValidateCrossEntropySpec(s).ok());
  s.config->vec = 3;
  ExpectInvalid(ValidateCrossEntropySpec(s), "config.vec:");
  s.config->vec = 16;  // 32 bytes of bf16
  ExpectInvalid(ValidateCrossEntropySpec(s), "config.vec:");
  s.config = ops::DefaultCrossEntropyConfig(32000, 8, 90, 2);
  for (int threads : {0, 16, 48, 2048}) {
    s.config->threads = threads;
    ExpectInvalid(ValidateCrossEntropySpec(s), "config.threads:");
  }
  s.config = ops::DefaultCrossEntropyConfig(32000, 8, 90, 2);
  s.config->unroll = 3;
  ExpectInvalid(ValidateCrossEntropySpec(s), "config.unroll:");
  s.config = ops::DefaultCrossEntropyConfig(32000, 8, 90, 2);
  for (int cluster : {-1, 9}) {
    s.config->cluster = cluster;
    ExpectInvalid(ValidateCrossEntropySpec(s), "config.cluster:");
  }
  // 4000 vectors over 64 threads: 63 each would not fit in registers; streaming is fine.
  s.config = CrossEntropyConfig{.vec = 8, .threads = 64, .unroll = 4, .cluster = 1};
  ExpectInvalid(ValidateCrossEntropySpec(s), "config.cluster:");
  s.config->cluster = 0;
  EXPECT_TRUE(ValidateCrossEntropySpec(s).ok());
}

TEST(CrossEntropySpecTest, ClustersNeedSm90) {
  auto rt = Runtime::Create({.target = "sm_80", .compile_only = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto ce = rt->CrossEntropy(
      {.vocab = 128256, .config = CrossEntropyConfig{.vec = 8, .threads = 512, .cluster = 4}});
  ASSERT_FALSE(ce.ok());
  ExpectInvalid(ce.status(), "config.cluster:");
  // The row staged by bulk copies needs sm_90 even in one block.
  auto staged = rt->CrossEntropy(
      {.vocab = 32000,
       .config = CrossEntropyConfig{.vec = 8, .threads = 256, .cluster = 1, .staged = 1}});
  ASSERT_FALSE(staged.ok());
  ExpectInvalid(staged.status(), "config.staged: bulk copies need sm_90");
  // Without a config, sm_80 gets a streaming default and sm_90 a cluster staging the row.
  auto old_gpu = rt->CrossEntropy({.vocab = 128256});
  ASSERT_TRUE(old_gpu.ok()) << old_gpu.status();
  EXPECT_EQ(old_gpu->config().cluster, 0);
  auto hopper = Runtime::Create({.target = "sm_90", .compile_only = true});
  ASSERT_TRUE(hopper.ok()) << hopper.status();
  auto ce90 = hopper->CrossEntropy({.vocab = 128256});
  ASSERT_TRUE(ce90.ok()) << ce90.status();
  EXPECT_EQ(ce90->config().cluster, 6);
  EXPECT_EQ(ce90->config().staged, 1);
}

TEST(CrossEntropyConfigTest, DefaultsAreValidForEveryVocab) {
  for (int arch : {80, 90}) {
    for (int64_t vocab = 2; vocab <= (1 << 20); vocab = vocab * 3 / 2 + 1) {
      for (int vec : {1, 2, 4, 8}) {
        const auto c = ops::DefaultCrossEntropyConfig(vocab, vec, arch, 2);
        SCOPED_TRACE(fmt::format("vocab {} arch {}: {}", vocab, arch, c.ToString()));
        EXPECT_EQ(c.vec, vec);
        EXPECT_EQ(c.threads % 32, 0);
        EXPECT_GE(c.threads, 32);
        EXPECT_LE(c.threads, 512);
        EXPECT_TRUE(c.unroll == 1 || c.unroll == 2 || c.unroll == 4);
        const int64_t vectors = (vocab + vec - 1) / vec;
        const int64_t per_thread = (vectors + c.threads - 1) / c.threads;
        EXPECT_LE(c.unroll, std::max<int64_t>(per_thread, 1));
        if (arch < 90) {
          EXPECT_LE(c.cluster, 1);
        }
        if (c.staged) {
          // Staged: 16-byte vectors, a share that leaves room for three blocks per SM.
          EXPECT_EQ(ops::StagedUnfit(c, vocab, 2, arch), "");
          EXPECT_LE(3 * (ops::StagedSharedBytes(c, vocab, 2) + 1024),
                    ops::MaxSharedBytesPerBlock(arch));
        } else if (c.cluster > 0) {
          // Resident: at most 8 vectors per thread.
          EXPECT_LE(ops::ResidentVectors(c, vocab), 8);
        } else {
          // Streaming: about 32 vectors per thread while 512 threads suffice for that; chosen only
          // when the row does not fit the registers of 8 blocks (or 1 block without clusters).
          EXPECT_GT(vectors, (arch < 90 ? 1 : 8) * 512 * 8);
          if (vectors <= 32 * 512) {
            EXPECT_LE(per_thread, 32);
          }
        }
        EXPECT_TRUE(
            ValidateCrossEntropySpec({.vocab = vocab, .dtype = DType::kF16, .config = c}).ok());
      }
    }
  }
  // Five blocks' shares an SM where a cluster allows it (bf16), else three (fp32 in 7 blocks of
  // 73 KB; sm_120's smaller shared memory).
  EXPECT_EQ(ops::DefaultCrossEntropyConfig(128256, 8, 90, 2).ToString(),
            "vec=8 threads=256 unroll=4 cluster=6 staged=1");
  EXPECT_EQ(ops::DefaultCrossEntropyConfig(128256, 4, 90, 4).ToString(),
            "vec=4 threads=256 unroll=4 cluster=7 staged=1");
  EXPECT_EQ(ops::DefaultCrossEntropyConfig(128256, 8, 120, 2).ToString(),
            "vec=8 threads=256 unroll=4 cluster=8 staged=1");
  EXPECT_EQ(ops::DefaultCrossEntropyConfig(128256, 8, 80, 2).ToString(),
            "vec=8 threads=512 unroll=4 cluster=0 staged=0");
  EXPECT_EQ(ops::DefaultCrossEntropyConfig(2, 8, 90, 2).ToString(),
            "vec=8 threads=32 unroll=1 cluster=1 staged=0");
  EXPECT_EQ(ops::MaxVecForCrossEntropy(2), 8);
  EXPECT_EQ(ops::MaxVecForCrossEntropy(4), 4);
}

// The kernels of each program, by the program's name ("count_reduce", ...).
std::map<std::string, std::vector<std::string>> Kernels(const std::vector<jit::Source>& programs) {
  std::map<std::string, std::vector<std::string>> out;
  for (const jit::Source& p : programs) {
    EXPECT_TRUE(p.name.starts_with("cross_entropy.")) << p.name;
    out[p.name.substr(14)] = p.name_expressions;
  }
  return out;
}

TEST(CrossEntropySpecTest, RenderSpecializesEverythingAsTemplateArguments) {
  auto programs = ops::RenderCrossEntropyPrograms({.vocab = 50257,
                                                   .dtype = DType::kF16,
                                                   .loss = {.target_type = IndexType::kInt32,
                                                            .reduction = Reduction::kSum,
                                                            .label_smoothing = 0.1f,
                                                            .softcap = 30.0f,
                                                            .argmax = true}},
                                                  {.vec = 1, .threads = 256, .unroll = 2});
  ASSERT_TRUE(programs.ok()) << programs.status();
  ASSERT_EQ(programs->size(), 5u);
  EXPECT_EQ((*programs)[0].name, "cross_entropy.forward_backward") << "the fused launch's first";
  using Names = std::vector<std::string>;
  const std::map<std::string, Names> k = Kernels(*programs);
  EXPECT_EQ(k.at("count_reduce"),
            (Names{"kjit::cross_entropy_count<int, 50257, 1024, kjit::NoClassWeight, true>",
                   "kjit::cross_entropy_loss_reduce<1024, kjit::kCeSum>"}));
  EXPECT_EQ(k.at("forward"),
            Names{"kjit::cross_entropy_forward<kjit::f16, int, 50257, 256, 1, 2, kjit::kCeSum, "
                  "kjit::CeLossTerms<true, false, true>, true, false, false, "
                  "kjit::NoClassWeight>"});
  EXPECT_EQ(k.at("forward_backward"),
            Names{"kjit::cross_entropy_forward<kjit::f16, int, 50257, 256, 1, 2, kjit::kCeSum, "
                  "kjit::CeLossTerms<true, false, true>, true, false, true, "
                  "kjit::NoClassWeight>"});
  EXPECT_EQ(k.at("backward"),
            Names{"kjit::cross_entropy_backward<kjit::f16, int, 50257, 256, 1, 2, kjit::kCeSum, "
                  "kjit::CeLossTerms<true, false, true>, kjit::NoClassWeight>"});
  EXPECT_EQ(k.at("rescale_gradient"),
            Names{"kjit::cross_entropy_rescale_gradient<kjit::f16, 50257, 256, 1, 4>"});
  for (const jit::Source& src : *programs) {
    EXPECT_NE(src.text.find("#include \"cross_entropy.cuh\""), std::string::npos);
    EXPECT_EQ(src.text.find("#define"), std::string::npos) << "no -D style specialization";
    EXPECT_EQ(src.params.at("vocab"), "50257");
    EXPECT_EQ(src.params.at("reduction"), "sum");
    EXPECT_EQ(src.params.at("softcap"), "on");  // its value is a launch argument
    EXPECT_EQ(src.headers.size(), 3u);
  }

  // Reduction none keeps the losses per row: no reduce kernel.
  const CrossEntropyConfig c8 = ops::DefaultCrossEntropyConfig(8, 8, 90, 2);
  auto none =
      ops::RenderCrossEntropyPrograms({.vocab = 8, .loss = {.reduction = Reduction::kNone}}, c8);
  ASSERT_TRUE(none.ok()) << none.status();
  ASSERT_EQ(none->size(), 5u);
  EXPECT_EQ(Kernels(*none).at("count_reduce").size(), 1u);
  // Different options give different programs (and so different cache keys).
  using P = ops::CrossEntropyProgram;
  auto plain = ops::RenderCrossEntropy({.vocab = 8}, c8, P::kForward);
  auto z = ops::RenderCrossEntropy({.vocab = 8, .loss = {.z_loss = 1e-4f}}, c8, P::kForward);
  ASSERT_TRUE(plain.ok() && z.ok());
  EXPECT_NE(plain->text, z->text);
  // Class weights are a template argument (the weights themselves are a launch argument).
  auto weighted = ops::RenderCrossEntropyPrograms(
      {.vocab = 8, .loss = {.class_weight_dtype = DType::kF32}}, c8);
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  const std::map<std::string, Names> w = Kernels(*weighted);
  EXPECT_EQ(w.at("count_reduce")[0], "kjit::cross_entropy_count<long long, 8, 1024, float, false>");
  EXPECT_TRUE(w.at("forward")[0].ends_with(", float>")) << w.at("forward")[0];
  EXPECT_EQ((*weighted)[0].params.at("class_weight_dtype"), "fp32");
  EXPECT_EQ(plain->params.count("class_weight_dtype"), 0u);
}

// A launch compiles only the kernels it runs: each launch's programs, and the kernels they hold.
TEST(CrossEntropySpecTest, EachLaunchLoadsOnlyTheProgramsOfItsKernels) {
  using P = ops::CrossEntropyProgram;
  using L = ops::CrossEntropyLaunch;
  // The longest first: BuildAll starts them in order.
  EXPECT_EQ(ops::CrossEntropyLaunchPrograms(L::kForwardBackward),
            (std::vector{P::kForwardBackward, P::kCountReduce}));
  EXPECT_EQ(ops::CrossEntropyLaunchPrograms(L::kForward),
            (std::vector{P::kForward, P::kCountReduce}));
  EXPECT_EQ(ops::CrossEntropyLaunchPrograms(L::kBackward),
            (std::vector{P::kBackward, P::kCountReduce}));
  EXPECT_EQ(ops::CrossEntropyLaunchPrograms(L::kRescaleGradient),
            (std::vector{P::kRescaleGradient}));

  // The default fused launch on sm_90: the staged kernel, the count and the reduce, nothing else.
  const CrossEntropySpec mean{.vocab = 128256};
  const CrossEntropyConfig c = ops::DefaultCrossEntropyConfig(128256, 8, 90, 2);
  ASSERT_EQ(c.staged, 1);
  auto kernels_of = [&](L launch) {
    std::vector<std::string> names;
    for (P p : ops::CrossEntropyLaunchPrograms(launch)) {
      auto src = ops::RenderCrossEntropy(mean, c, p);
      EXPECT_TRUE(src.ok()) << src.status();
      if (!src.ok()) continue;
      EXPECT_EQ(src->name, std::string("cross_entropy.") + ops::CrossEntropyProgramName(p));
      for (const std::string& e : src->name_expressions) names.push_back(e.substr(0, e.find('<')));
    }
    return names;
  };
  using Names = std::vector<std::string>;
  EXPECT_EQ(kernels_of(L::kForwardBackward),
            (Names{"kjit::cross_entropy_staged", "kjit::cross_entropy_count",
                   "kjit::cross_entropy_loss_reduce"}));
  EXPECT_EQ(kernels_of(L::kForward),
            (Names{"kjit::cross_entropy_forward", "kjit::cross_entropy_count",
                   "kjit::cross_entropy_loss_reduce"}));
  EXPECT_EQ(kernels_of(L::kBackward),
            (Names{"kjit::cross_entropy_backward", "kjit::cross_entropy_count",
                   "kjit::cross_entropy_loss_reduce"}));
  EXPECT_EQ(kernels_of(L::kRescaleGradient), Names{"kjit::cross_entropy_rescale_gradient"});
}

// A program holds only the config fields its kernels' templates take, so the configs that share
// a kernel share its program (and cache entry): kjit-tune's dozens of candidates, and a process's
// tuned buckets, compile count and reduce once, the rescale once a vector width, and the forward
// and backward once a (vec, threads, unroll).
TEST(CrossEntropySpecTest, ConfigsThatShareAKernelShareItsProgram) {
  using P = ops::CrossEntropyProgram;
  const CrossEntropySpec spec{.vocab = 128256};
  const CrossEntropyConfig staged = ops::DefaultCrossEntropyConfig(128256, 8, 90, 2);
  ASSERT_EQ(staged,
            (CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 4, .cluster = 6, .staged = 1}));
  CrossEntropyConfig staged_unroll2 = staged, streaming = staged, wide = staged, narrow = staged;
  staged_unroll2.unroll = 2;  // the staged kernel has no unrolled loop
  streaming.cluster = streaming.staged = 0;
  wide.threads = 512;
  narrow.vec = 2;  // streamed: the staged kernel's bulk copies move 16-byte vectors
  narrow.cluster = narrow.staged = 0;
  auto text = [&](const CrossEntropyConfig& c, P p) {
    auto src = ops::RenderCrossEntropy(spec, c, p);
    EXPECT_TRUE(src.ok()) << src.status();
    return src.ok() ? src->text : "";
  };
  for (const CrossEntropyConfig& c : {staged_unroll2, streaming, wide, narrow}) {
    EXPECT_EQ(text(staged, P::kCountReduce), text(c, P::kCountReduce)) << c.ToString();
  }
  EXPECT_EQ(text(staged, P::kRescaleGradient), text(wide, P::kRescaleGradient));
  EXPECT_NE(text(staged, P::kRescaleGradient), text(narrow, P::kRescaleGradient)) << "vec";
  for (P p : {P::kForward, P::kBackward}) {
    EXPECT_EQ(text(staged, p), text(streaming, p)) << ops::CrossEntropyProgramName(p);
    EXPECT_NE(text(staged, p), text(staged_unroll2, p)) << ops::CrossEntropyProgramName(p);
    EXPECT_NE(text(staged, p), text(wide, p)) << ops::CrossEntropyProgramName(p);
  }
  EXPECT_EQ(text(staged, P::kForwardBackward), text(staged_unroll2, P::kForwardBackward));
  EXPECT_NE(text(staged, P::kForwardBackward), text(streaming, P::kForwardBackward));
  EXPECT_NE(text(streaming, P::kForwardBackward),
            text(CrossEntropyConfig{.vec = 8, .threads = 256, .unroll = 2}, P::kForwardBackward))
      << "a streamed row unrolls";
  // Each program's params name the fields it takes.
  auto fused = ops::RenderCrossEntropy(spec, staged, P::kForwardBackward);
  ASSERT_TRUE(fused.ok()) << fused.status();
  EXPECT_EQ(fused->params.at("cluster"), "6");
  EXPECT_EQ(fused->params.at("staged"), "1");
  EXPECT_EQ(fused->params.count("unroll"), 0u);
  auto counts = ops::RenderCrossEntropy(spec, staged, P::kCountReduce);
  ASSERT_TRUE(counts.ok()) << counts.status();
  EXPECT_EQ(counts->params, ops::CrossEntropyParams(spec));
}

class CompileOnlyCrossEntropyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    auto rt =
        Runtime::Create({.target = "sm_90", .compile_only = true, .cache_dir = dir_ + "/cache"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    rt_.emplace(std::move(*rt));
    auto ce = rt_->CrossEntropy({.vocab = V, .dtype = DType::kBF16, .loss = {.argmax = true}});
    ASSERT_TRUE(ce.ok()) << ce.status();
    ce_.emplace(std::move(*ce));
  }

  // Fake, well-aligned device addresses: compile-only never dereferences them.
  static void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
  CrossEntropyArgs Good() const {
    return {.logits = TensorView::Matrix(Addr(0x1000000), DType::kBF16, R, V),
            .targets = IndexView::Of(Addr(0x2000000), IndexType::kInt64, R),
            .loss = TensorView::Vector(Addr(0x3000000), DType::kF32, 1),
            .lse = TensorView::Vector(Addr(0x4000000), DType::kF32, R),
            .argmax = IndexView::Of(Addr(0x5000000), IndexType::kInt64, R),
            .workspace = Addr(0x6000000),
            .workspace_bytes = ce_->WorkspaceBytes(R)};
  }
  CrossEntropyArgs GoodWithGrad() const {
    CrossEntropyArgs a = Good();
    a.grad = TensorView::Matrix(Addr(0x7000000), DType::kBF16, R, V);
    a.grad_output = TensorView::Vector(Addr(0x8000000), DType::kF32, 1);
    return a;
  }
  CrossEntropyBackwardArgs GoodBackward() const {
    return {.logits = TensorView::Matrix(Addr(0x1000000), DType::kBF16, R, V),
            .targets = IndexView::Of(Addr(0x2000000), IndexType::kInt64, R),
            .lse = TensorView::Vector(Addr(0x4000000), DType::kF32, R),
            .grad = TensorView::Matrix(Addr(0x7000000), DType::kBF16, R, V),
            .workspace = Addr(0x6000000),
            .workspace_bytes = ce_->WorkspaceBytes(R)};
  }
  static void ExpectReachesDevice(const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(ToStd(s.message()).find("compile-only"), std::string_view::npos) << s;
  }
  static constexpr int64_t V = 1000, R = 8;
  testing::TempDir tmp_{"kjit_ce_spec"};
  std::string dir_;
  std::optional<Runtime> rt_;
  std::optional<CrossEntropy> ce_;
};

TEST_F(CompileOnlyCrossEntropyTest, ValidArgumentsReachTheCompileOnlyError) {
  ExpectReachesDevice(ce_->Forward(nullptr, Good()));
  ExpectReachesDevice(ce_->ForwardBackward(nullptr, GoodWithGrad()));
  auto in_place = GoodWithGrad();
  in_place.grad = in_place.logits;
  ExpectReachesDevice(ce_->ForwardBackward(nullptr, in_place));
  auto padded = GoodWithGrad();  // a view with a row stride, gradient into the same view
  padded.logits.row_stride = V + 24;
  padded.grad = padded.logits;
  ExpectReachesDevice(ce_->ForwardBackward(nullptr, padded));
  auto no_options = Good();  // lse and grad_output are optional
  no_options.lse = {};
  ExpectReachesDevice(ce_->Forward(nullptr, no_options));
  ExpectReachesDevice(ce_->Backward(nullptr, GoodBackward()));
  auto built = ce_->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->target, "sm_90");
  EXPECT_EQ(built->kernels.size(), 6u);
}

// Build compiles every program a later launch may load, each its own cache entry, so that the
// first launch of any kind in a new process finds them all on disk; a second config compiles
// only the programs whose kernels depend on what changed.
TEST_F(CompileOnlyCrossEntropyTest, BuildPrebuildsEveryProgram) {
  auto built = ce_->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->origin, "compiled");
  ASSERT_EQ(built->programs.size(), 5u);
  EXPECT_EQ(built->program, "cross_entropy.forward_backward") << "the op's first program";
  EXPECT_EQ(built->key, built->programs[0].key);
  EXPECT_EQ(built->path, built->programs[0].path);
  EXPECT_EQ(built->params.at("config"), ce_->config().ToString());
  std::map<std::string, size_t> kernels;  // by program
  std::set<std::string> keys;
  size_t bytes = 0;
  for (const BuildInfo& p : built->programs) {
    kernels[p.program] = p.kernels.size();
    keys.insert(p.key);
    bytes += p.bytes;
    EXPECT_EQ(p.origin, "compiled") << p.program;
    EXPECT_EQ(p.path, dir_ + "/cache/" + p.key + ".kjit") << p.program;
    EXPECT_TRUE(std::filesystem::is_regular_file(p.path)) << p.path;
    EXPECT_TRUE(p.programs.empty()) << p.program;
  }
  EXPECT_EQ(kernels, (std::map<std::string, size_t>{{"cross_entropy.count_reduce", 2},
                                                    {"cross_entropy.forward", 1},
                                                    {"cross_entropy.forward_backward", 1},
                                                    {"cross_entropy.backward", 1},
                                                    {"cross_entropy.rescale_gradient", 1}}));
  EXPECT_EQ(keys.size(), 5u);
  EXPECT_EQ(built->bytes, bytes);
  EXPECT_EQ(built->kernels.size(), 6u);

  auto again = ce_->Build();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->origin, "memory");
  EXPECT_EQ(again->key, built->key);

  const CrossEntropyConfig streaming{.vec = 8, .threads = 512, .unroll = 4};
  ASSERT_NE(streaming, ce_->config());
  auto other = rt_->CrossEntropy(
      {.vocab = V, .dtype = DType::kBF16, .loss = {.argmax = true}, .config = streaming});
  ASSERT_TRUE(other.ok()) << other.status();
  auto second = other->Build();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->origin, "compiled");
  for (const BuildInfo& p : second->programs) {
    const bool shared = p.program == "cross_entropy.count_reduce" ||
                        p.program == "cross_entropy.rescale_gradient";  // the same vec
    EXPECT_EQ(p.origin, shared ? "memory" : "compiled") << p.program;
  }
}

TEST_F(CompileOnlyCrossEntropyTest, ForwardNamesEveryBadArgument) {
  struct Bad {
    std::function<void(CrossEntropyArgs&)> edit;
    std::string prefix;
  };
  const std::vector<Bad> cases = {
      {[](auto& a) { a.logits.data = nullptr; }, "logits: null"},
      {[](auto& a) { a.logits.dtype = DType::kF16; }, "logits: dtype"},
      {[](auto& a) { a.logits.cols = V + 1; }, "logits: cols"},
      {[](auto& a) { a.logits.rows = 0; }, "logits: rows"},
      {[](auto& a) { a.logits.row_stride = V - 1; }, "logits: row_stride"},
      {[](auto& a) { a.logits.data = Addr(0x1000001); }, "logits: pointer"},
      {[](auto& a) { a.targets.data = nullptr; }, "targets: null"},
      {[](auto& a) { a.targets.type = IndexType::kInt32; }, "targets: type"},
      {[](auto& a) { a.targets.size = R - 1; }, "targets: size"},
      {[](auto& a) { a.targets.data = Addr(0x2000004); }, "targets: pointer"},
      {[](auto& a) { a.loss.data = nullptr; }, "loss: null"},
      {[](auto& a) { a.loss.dtype = DType::kBF16; }, "loss: dtype"},
      {[](auto& a) { a.loss = TensorView::Vector(a.loss.data, DType::kF32, R); }, "loss: cols"},
      {[](auto& a) { a.lse.cols = R + 1; }, "lse: cols"},
      {[](auto& a) { a.lse.dtype = DType::kBF16; }, "lse: dtype"},
      {[](auto& a) { a.argmax = {}; }, "argmax: null"},
      {[](auto& a) { a.argmax.type = IndexType::kInt32; }, "argmax: type"},
      {[](auto& a) { a.argmax.size = 1; }, "argmax: size"},
      {[](auto& a) { a.grad = a.logits; }, "grad: given to Forward"},
      {[](auto& a) { a.grad_output = TensorView::Vector(Addr(0x8000000), DType::kF32, 1); },
       "grad_output: given to Forward"},
      {[](auto& a) { a.workspace = nullptr; }, "workspace: null"},
      {[](auto& a) { a.workspace = Addr(0x6000004); }, "workspace: must be 16-byte aligned"},
      {[](auto& a) { a.workspace_bytes = 16; }, "workspace_bytes:"},
      {[](auto& a) { a.lse.data = Addr(0x3000000); }, "lse: must not alias loss"},
      {[](auto& a) { a.loss.data = Addr(0x1000000 + 64); }, "loss: overlaps logits"},
      {[](auto& a) { a.argmax.data = Addr(0x2000000 + 8); }, "argmax: overlaps targets"},
      {[](auto& a) { a.workspace = Addr(0x4000000); }, "workspace: must not alias lse"},
  };
  for (const Bad& c : cases) {
    CrossEntropyArgs a = Good();
    c.edit(a);
    SCOPED_TRACE(c.prefix);
    ExpectInvalid(ce_->Forward(nullptr, a), c.prefix);
  }
}

TEST_F(CompileOnlyCrossEntropyTest, ForwardBackwardNamesEveryBadArgument) {
  struct Bad {
    std::function<void(CrossEntropyArgs&)> edit;
    std::string prefix;
  };
  const std::vector<Bad> cases = {
      {[](auto& a) { a.grad = {}; }, "grad: null"},
      {[](auto& a) { a.grad.dtype = DType::kF32; }, "grad: dtype"},
      {[](auto& a) { a.grad.rows = R - 1; }, "grad: rows"},
      {[](auto& a) { a.grad.row_stride = V - 8; }, "grad: row_stride"},
      {[](auto& a) {
         a.grad = a.logits;
         a.grad.row_stride = V + 8;
       },
       "grad: aliases logits with row_stride"},
      {[](auto& a) { a.grad.data = static_cast<char*>(a.logits.data) + 2 * 10; },
       "grad: overlaps logits"},
      {[](auto& a) { a.grad.data = Addr(0x2000000); }, "grad: must not alias targets"},
      {[](auto& a) { a.lse.data = Addr(0x7000000 + 64); }, "grad: overlaps lse"},
      {[](auto& a) { a.grad_output = TensorView::Vector(a.grad_output.data, DType::kF32, R); },
       "grad_output: cols"},
      {[](auto& a) { a.grad_output.dtype = DType::kBF16; }, "grad_output: dtype"},
      {[](auto& a) { a.loss.data = Addr(0x8000000); }, "loss: must not alias grad_output"},
  };
  for (const Bad& c : cases) {
    CrossEntropyArgs a = GoodWithGrad();
    c.edit(a);
    SCOPED_TRACE(c.prefix);
    ExpectInvalid(ce_->ForwardBackward(nullptr, a), c.prefix);
  }
}

TEST_F(CompileOnlyCrossEntropyTest, BackwardNamesEveryBadArgument) {
  auto a = GoodBackward();
  a.lse = {};
  ExpectInvalid(ce_->Backward(nullptr, a), "lse: null");
  a = GoodBackward();
  a.lse.cols = R - 1;
  ExpectInvalid(ce_->Backward(nullptr, a), "lse: cols");
  a = GoodBackward();
  a.grad = {};
  ExpectInvalid(ce_->Backward(nullptr, a), "grad: null");
  a = GoodBackward();
  a.grad.data = static_cast<char*>(a.logits.data) + 2;
  ExpectInvalid(ce_->Backward(nullptr, a), "grad: overlaps logits");
  a = GoodBackward();
  a.targets.type = IndexType::kInt32;
  ExpectInvalid(ce_->Backward(nullptr, a), "targets: type");
  a = GoodBackward();
  a.workspace = nullptr;
  ExpectInvalid(ce_->Backward(nullptr, a), "workspace: null");
  a = GoodBackward();
  a.workspace = Addr(0x4000000);
  ExpectInvalid(ce_->Backward(nullptr, a), "workspace: must not alias lse");
  a = GoodBackward();
  a.grad = a.logits;  // in place
  ExpectReachesDevice(ce_->Backward(nullptr, a));
}

// Class weights: a [vocab] vector of the spec's class_weight_dtype in every mode, read only (it
// may not overlap an output), and refused by an op made without them.
TEST_F(CompileOnlyCrossEntropyTest, ClassWeightIsCheckedInEveryMode) {
  auto weighted = rt_->CrossEntropy({.vocab = V,
                                     .dtype = DType::kBF16,
                                     .loss = {.argmax = true, .class_weight_dtype = DType::kF32}});
  ASSERT_TRUE(weighted.ok()) << weighted.status();
  const TensorView good = TensorView::Vector(Addr(0x9000000), DType::kF32, V);
  struct Bad {
    TensorView w;
    std::string prefix;
  };
  const std::vector<Bad> cases = {
      {{}, "class_weight: null"},
      {TensorView::Vector(good.data, DType::kF32, V - 1),
       "class_weight: cols is 999, expected 1000"},
      {TensorView::Vector(good.data, DType::kF32, V + 1), "class_weight: cols"},
      {TensorView::Vector(good.data, DType::kBF16, V),
       "class_weight: dtype is bf16, expected fp32"},
      {TensorView::Matrix(good.data, DType::kF32, 2, V), "class_weight: rows is 2, expected 1"},
      {TensorView::Vector(Addr(0x9000002), DType::kF32, V), "class_weight: pointer"},
      {TensorView::Vector(Addr(0x3000000), DType::kF32, V), "loss: must not alias class_weight"},
  };
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.prefix);
    CrossEntropyArgs f = Good();
    f.class_weight = c.w;
    ExpectInvalid(weighted->Forward(nullptr, f), c.prefix);
    CrossEntropyArgs fb = GoodWithGrad();
    fb.class_weight = c.w;
    ExpectInvalid(weighted->ForwardBackward(nullptr, fb), c.prefix);
    if (c.prefix.starts_with("class_weight")) {
      CrossEntropyBackwardArgs b = GoodBackward();
      b.class_weight = c.w;
      ExpectInvalid(weighted->Backward(nullptr, b), c.prefix);
    }
  }
  CrossEntropyArgs f = Good();
  f.class_weight = good;
  ExpectReachesDevice(weighted->Forward(nullptr, f));
  CrossEntropyArgs fb = GoodWithGrad();
  fb.class_weight = good;
  ExpectReachesDevice(weighted->ForwardBackward(nullptr, fb));
  CrossEntropyBackwardArgs b = GoodBackward();
  b.class_weight = good;
  ExpectReachesDevice(weighted->Backward(nullptr, b));
  // The unweighted op refuses weights instead of ignoring them.
  ExpectInvalid(ce_->Forward(nullptr, f), "class_weight: given, but the op was created without");
  ExpectInvalid(ce_->Backward(nullptr, b), "class_weight: given");
  // The weighted program compiles for sm_90 (every kernel, bf16 weights with smoothing too).
  ASSERT_TRUE(weighted->Build().ok());
  auto smoothed = rt_->CrossEntropy({.vocab = V,
                                     .dtype = DType::kBF16,
                                     .loss = {.label_smoothing = 0.1f,
                                              .z_loss = 1e-4f,
                                              .softcap = 30.0f,
                                              .class_weight_dtype = DType::kBF16}});
  ASSERT_TRUE(smoothed.ok()) << smoothed.status();
  auto built = smoothed->Build();
  ASSERT_TRUE(built.ok()) << built.status();
}

// ConfigFor(logits) names the config a launch on those views uses: an odd vocab's contiguous rows
// are 2-byte aligned, so scalar accesses (what `kjit bench` then reports).
// Rows that start off a vector boundary take a scalar head before their vectors (CeLayout): odd
// vocabs and misaligned views keep the widest vector.
TEST_F(CompileOnlyCrossEntropyTest, ConfigForOddRowsKeepsTheWidestVector) {
  EXPECT_EQ(ce_->ConfigFor(Good().logits), ce_->ConfigFor(R));
  EXPECT_EQ(ce_->ConfigFor(Good().logits).vec, 8);
  auto odd = rt_->CrossEntropy({.vocab = 50257, .dtype = DType::kBF16});
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ(odd->ConfigFor(16).vec, 8);
  const TensorView rows = TensorView::Matrix(Addr(0x1000002), DType::kBF16, 16, 50257);
  EXPECT_EQ(odd->ConfigFor(rows).vec, 8);
  EXPECT_EQ(odd->ConfigFor(rows, /*fused=*/false).vec, 8);
}

TEST_F(CompileOnlyCrossEntropyTest, ReductionNoneTakesPerRowLossAndUpstream) {
  auto none = rt_->CrossEntropy(
      {.vocab = V, .dtype = DType::kBF16, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok()) << none.status();
  CrossEntropyArgs a = GoodWithGrad();
  a.argmax = {};
  a.workspace_bytes = none->WorkspaceBytes(R);
  ExpectInvalid(none->ForwardBackward(nullptr, a), "loss: cols");
  a.loss = TensorView::Vector(a.loss.data, DType::kF32, R);
  ExpectInvalid(none->ForwardBackward(nullptr, a), "grad_output: cols");
  a.grad_output = TensorView::Vector(a.grad_output.data, DType::kF32, R);
  ExpectReachesDevice(none->ForwardBackward(nullptr, a));
  a.argmax = IndexView::Of(Addr(0x5000000), IndexType::kInt64, R);
  ExpectInvalid(none->ForwardBackward(nullptr, a), "argmax: given");
}

TEST_F(CompileOnlyCrossEntropyTest, WorkspaceIsCountersPlusOneFloatPerRow) {
  EXPECT_EQ(ce_->WorkspaceBytes(1), 32);
  EXPECT_EQ(ce_->WorkspaceBytes(4096), 16 + 4 * 4096);
  EXPECT_LT(ce_->WorkspaceBytes(4096), 1 << 20) << "O(rows), never O(rows x vocab)";
  EXPECT_EQ(ce_->WorkspaceBytes(7) % 16, 0);
  auto none = rt_->CrossEntropy({.vocab = V, .loss = {.reduction = Reduction::kNone}});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->WorkspaceBytes(1 << 20), 16) << "only the counters";
  // A wild row count (launches refuse it after sizing the workspace) does not overflow.
  EXPECT_EQ(ce_->WorkspaceBytes(INT64_MAX), ce_->WorkspaceBytes(INT32_MAX));
  EXPECT_EQ(sizeof(CrossEntropyCounters), 16u);
  EXPECT_EQ(offsetof(CrossEntropyCounters, out_of_range_rows), 4u);
  EXPECT_EQ(offsetof(CrossEntropyCounters, mean_divisor), 8u);
}

}  // namespace
}  // namespace kjit
