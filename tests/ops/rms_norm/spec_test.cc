// RMSNorm without a GPU: spec validation, rendering, and argument checks through a compile-only
// runtime (each bad argument is named, and nothing reaches a launch).
#include "kjit/rms_norm.h"

#include <gtest/gtest.h>

#include "jit/compiler.h"
#include "jit/status_helpers.h"
#include "kjit/runtime.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/program.h"
#include "ops/rms_norm/tuning/search_space.h"
#include "tests/expect_status.h"
#include "tests/temp_dir.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;

TEST(RmsNormSpecTest, RejectsBadSpecsNamingTheField) {
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 0}), "hidden:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = -5}), "hidden:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 65537}), "hidden:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 64, .eps = -1e-6f}), "eps:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 64, .eps = NAN}), "eps:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 64, .eps = INFINITY}), "eps:");
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 64, .weight_offset = NAN}), "weight_offset:");
  EXPECT_TRUE(ValidateRmsNormSpec({.hidden = 1}).ok());
  EXPECT_TRUE(ValidateRmsNormSpec({.hidden = 65536, .eps = 0}).ok());
  ExpectInvalid(ValidateRmsNormSpec({.hidden = 64, .casting = static_cast<RmsNormCasting>(3)}),
                "casting: 3 is out of range");
}

// Casting none computes in the dtype: the weight must have it too.
TEST(RmsNormSpecTest, CastingNoneNeedsTheWeightInTheDtype) {
  const RmsNormSpec none{.hidden = 64, .dtype = DType::kBF16, .casting = RmsNormCasting::kNone};
  EXPECT_TRUE(ValidateRmsNormSpec(none).ok());
  RmsNormSpec s = none;
  s.weight_dtype = DType::kBF16;
  EXPECT_TRUE(ValidateRmsNormSpec(s).ok());
  s.weight_dtype = DType::kF32;
  ExpectInvalid(ValidateRmsNormSpec(s), "weight_dtype: fp32 must be the dtype (bf16)");
  s.casting = RmsNormCasting::kLlama;
  EXPECT_TRUE(ValidateRmsNormSpec(s).ok()) << "llama takes an fp32 weight";
  s = {.hidden = 64,
       .dtype = DType::kF32,
       .weight_dtype = DType::kF32,
       .casting = RmsNormCasting::kNone};
  EXPECT_TRUE(ValidateRmsNormSpec(s).ok());
}

TEST(RmsNormSpecTest, CastingNamesRoundTrip) {
  for (RmsNormCasting c : {RmsNormCasting::kLlama, RmsNormCasting::kGemma, RmsNormCasting::kNone}) {
    auto back = ops::ParseRmsNormCasting(Name(c));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, c);
  }
  EXPECT_STREQ(Name(RmsNormCasting::kNone), "none");
  ExpectInvalid(ops::ParseRmsNormCasting("Gemma").status(),
                "casting: 'Gemma' is not a casting (llama, gemma, none)");
}

TEST(RmsNormSpecTest, RenderNamesCastingNoneAsTemplateArgument) {
  auto src =
      ops::RenderRmsNorm({.hidden = 4096, .dtype = DType::kBF16, .casting = RmsNormCasting::kNone},
                         ops::DefaultRmsNormConfig(4096, 8));
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->name_expressions[0],
            "kjit::rms_norm_forward<kjit::bf16, kjit::bf16, 4096, 256, 1, 8, 2, false>");
  EXPECT_EQ(src->params.at("casting"), "none");
}

TEST(RmsNormSpecTest, RejectsBadConfigs) {
  RmsNormSpec s{.hidden = 4096};
  s.config = ops::DefaultRmsNormConfig(4096, 8);
  EXPECT_TRUE(ValidateRmsNormSpec(s).ok());
  s.config->vec = 3;
  ExpectInvalid(ValidateRmsNormSpec(s), "config.vec:");
  s.config->vec = 16;  // 32 bytes of bf16
  ExpectInvalid(ValidateRmsNormSpec(s), "config.vec:");
  s.config = ops::DefaultRmsNormConfig(4096, 8);
  s.config->forward = {.threads_per_row = 48, .rows_per_block = 1};
  ExpectInvalid(ValidateRmsNormSpec(s), "config.forward:");
  s.config->forward = {.threads_per_row = 64, .rows_per_block = 2};
  ExpectInvalid(ValidateRmsNormSpec(s), "config.forward:");
  s.config = ops::DefaultRmsNormConfig(4096, 8);
  s.config->backward = {.threads_per_row = 16, .rows_per_block = 3};
  ExpectInvalid(ValidateRmsNormSpec(s), "config.backward:");
}

TEST(RmsNormSpecTest, RingBackwardIsRenderedAndChecked) {
  RmsNormConfig c = ops::DefaultRmsNormConfig(4096, 8);
  c.backward.ring = 3;
  EXPECT_EQ(c.ToString(), "vec=8 fwd=256x1 bwd=512x1r3");
  auto src = ops::RenderRmsNorm({.hidden = 4096, .dtype = DType::kBF16}, c);
  ASSERT_TRUE(src.ok()) << src.status();
  EXPECT_EQ(src->name_expressions[1],
            "kjit::rms_norm_backward_ring<kjit::bf16, kjit::bf16, 4096, 512, 1, 8, 3>");
  RmsNormSpec s{.hidden = 4096, .dtype = DType::kBF16, .config = c};
  EXPECT_TRUE(ValidateRmsNormSpec(s).ok()) << ValidateRmsNormSpec(s);
  s.config->backward.ring = 1;
  ExpectInvalid(ValidateRmsNormSpec(s), "config.backward: ring 1");
  s.config->backward.ring = 5;
  ExpectInvalid(ValidateRmsNormSpec(s), "config.backward: ring 5");
  s.config = c;
  s.config->forward.ring = 2;
  ExpectInvalid(ValidateRmsNormSpec(s), "config.forward: ring 2");
  // 64 threads x 8 elements: 8 vectors of dy and 8 of x a thread, 256 bytes: no ring.
  s.config = c;
  s.config->backward = {.threads_per_row = 64, .rows_per_block = 1, .ring = 2};
  ExpectInvalid(ValidateRmsNormSpec(s), "config.backward: a ring needs");
}

// NVRTC compiles of the ring backward (the CPU side of what the GPU suite runs): every dtype pair,
// every arch, every ring, odd hidden sizes with the narrow vectors they get, sub-warp and
// block-wide rows.
TEST(RmsNormSpecTest, RingBackwardCompilesForEveryArchDtypeAndShape) {
  auto nvrtc = jit::Nvrtc::Get();
  ASSERT_TRUE(nvrtc.ok()) << nvrtc.status();
  int compiled = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    const jit::Target target = *jit::ParseTarget(arch);
    for (auto [t, w] : {std::pair{DType::kBF16, DType::kBF16}, std::pair{DType::kF16, DType::kF32},
                        std::pair{DType::kF32, DType::kF32}}) {
      for (auto [hidden, shape] : {std::pair<int64_t, RowShape>{4096, {512, 1}},
                                   {4096, {1024, 1}},
                                   {1024, {32, 4}},
                                   {7, {8, 16}},
                                   {1, {1, 128}},
                                   {4095, {1024, 1}},
                                   {5120, {640, 1}}}) {
        const int elem = static_cast<int>(std::max(SizeOf(t), SizeOf(w)));
        const int vec = ops::MaxVecForHidden(hidden, elem);
        for (int ring : {2, 3, 4}) {
          RmsNormConfig c = ops::DefaultRmsNormConfig(hidden, vec);
          c.backward = shape;
          c.backward.ring = ring;
          if (!ops::RowFitsRing(hidden, vec, static_cast<int>(SizeOf(t)), c.backward)) continue;
          const RmsNormSpec spec{.hidden = hidden, .dtype = t, .weight_dtype = w};
          auto src = ops::RenderRmsNorm(spec, c);
          ASSERT_TRUE(src.ok()) << src.status();
          auto bin = jit::Compile(**nvrtc, *src, target);
          ASSERT_TRUE(bin.ok()) << arch << " " << c.ToString() << ": " << bin.status();
          EXPECT_EQ(bin->lowered_names.size(), 3u);
          ++compiled;
          if (arch != std::string_view("sm_90") || t != DType::kBF16) break;  // one ring elsewhere
        }
      }
    }
  }
  EXPECT_GE(compiled, 40);
}

// Every candidate of the search space renders and passes validation, ring ones included.
TEST(RmsNormSpecTest, SearchSpaceOffersRingsWhereRowsFit) {
  int rings = 0;
  for (auto [hidden, t] : {std::pair<int64_t, DType>{4096, DType::kBF16},
                           {4096, DType::kF32},
                           {1024, DType::kBF16},
                           {65536, DType::kBF16},
                           {7, DType::kF16}}) {
    const int elem = static_cast<int>(SizeOf(t));
    const int vec = ops::MaxVecForHidden(hidden, elem);
    for (const auto& c : ops::RmsNormSearchSpace(hidden, vec, elem)) {
      if (!c.pruned.empty()) continue;
      rings += c.config.backward.ring > 0;
      const RmsNormSpec spec{.hidden = hidden, .dtype = t, .config = c.config};
      EXPECT_TRUE(ValidateRmsNormSpec(spec).ok()) << hidden << " " << c.config.ToString();
      auto back = ParseRmsNormConfig(c.config.ToString());
      ASSERT_TRUE(back.ok()) << back.status();
      EXPECT_EQ(*back, c.config);
    }
  }
  EXPECT_GE(rings, 6);
}

TEST(RmsNormSpecTest, RenderSpecializesEverythingAsTemplateArguments) {
  auto src = ops::RenderRmsNorm({.hidden = 5120,
                                 .dtype = DType::kF16,
                                 .weight_dtype = DType::kF32,
                                 .casting = RmsNormCasting::kGemma,
                                 .fused_residual = true},
                                ops::DefaultRmsNormConfig(5120, 4));
  ASSERT_TRUE(src.ok()) << src.status();
  ASSERT_EQ(src->name_expressions.size(), 3u);
  EXPECT_EQ(src->name_expressions[0],
            "kjit::rms_norm_forward<kjit::f16, float, 5120, 640, 1, 4, 1, true>");
  EXPECT_EQ(src->name_expressions[2], "kjit::rms_norm_dw_reduce<float, 5120, 32, 32>");
  EXPECT_NE(src->text.find("#include \"rms_norm.cuh\""), std::string::npos);
  EXPECT_EQ(src->text.find("#define"), std::string::npos) << "no -D style specialization";
  EXPECT_EQ(src->params.at("hidden"), "5120");
  EXPECT_EQ(src->params.at("casting"), "gemma");
  EXPECT_EQ(src->headers.size(), 3u);
}

class CompileOnlyRmsNormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
    auto rt =
        Runtime::Create({.target = "sm_90", .compile_only = true, .cache_dir = dir_ + "/cache"});
    ASSERT_TRUE(rt.ok()) << rt.status();
    auto norm = rt->RmsNorm({.hidden = H, .dtype = DType::kBF16});
    ASSERT_TRUE(norm.ok()) << norm.status();
    norm_.emplace(std::move(*norm));
  }

  // Fake, well-aligned device addresses: compile-only never dereferences them.
  static void* Addr(uintptr_t a) { return reinterpret_cast<void*>(a); }
  RmsNormForwardArgs Good() const {
    return {.x = TensorView::Matrix(Addr(0x100000), DType::kBF16, R, H),
            .weight = TensorView::Vector(Addr(0x200000), DType::kBF16, H),
            .y = TensorView::Matrix(Addr(0x300000), DType::kBF16, R, H),
            .rstd = TensorView::Vector(Addr(0x400000), DType::kF32, R)};
  }
  RmsNormBackwardArgs GoodBackward() const {
    return {.dy = TensorView::Matrix(Addr(0x100000), DType::kBF16, R, H),
            .x = TensorView::Matrix(Addr(0x500000), DType::kBF16, R, H),
            .weight = TensorView::Vector(Addr(0x200000), DType::kBF16, H),
            .rstd = TensorView::Vector(Addr(0x400000), DType::kF32, R),
            .dx = TensorView::Matrix(Addr(0x300000), DType::kBF16, R, H),
            .dw = TensorView::Vector(Addr(0x600000), DType::kBF16, H),
            .workspace = Addr(0x700000),
            .workspace_bytes = 1 << 20};
  }
  static constexpr int64_t H = 256, R = 8;
  testing::TempDir tmp_{"kjit_rms_norm_spec"};
  std::string dir_;
  std::optional<RmsNorm> norm_;
};

TEST_F(CompileOnlyRmsNormTest, ValidArgumentsReachTheCompileOnlyError) {
  absl::Status s = norm_->Forward(nullptr, Good());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(ToStd(s.message()).find("compile-only"), std::string_view::npos);
  s = norm_->Backward(nullptr, GoodBackward());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  auto built = norm_->Build();
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_EQ(built->target, "sm_90");
}

TEST_F(CompileOnlyRmsNormTest, ForwardNamesEveryBadArgument) {
  auto a = Good();
  a.x.data = nullptr;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: null");
  a = Good();
  a.x.dtype = DType::kF16;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: dtype");
  a = Good();
  a.x.cols = H + 1;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: cols");
  a = Good();
  a.x.rows = 0;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: rows");
  a = Good();
  a.x.rows = -3;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: rows");
  a = Good();
  a.x.row_stride = H - 1;
  ExpectInvalid(norm_->Forward(nullptr, a), "x: row_stride");
  a = Good();
  a.x.data = Addr(0x100001);
  ExpectInvalid(norm_->Forward(nullptr, a), "x: pointer");
  a = Good();
  a.y.rows = R + 1;
  ExpectInvalid(norm_->Forward(nullptr, a), "y: rows");
  a = Good();
  a.weight.cols = H / 2;
  ExpectInvalid(norm_->Forward(nullptr, a), "weight: cols");
  a = Good();
  a.rstd.dtype = DType::kBF16;
  ExpectInvalid(norm_->Forward(nullptr, a), "rstd: dtype");
  a = Good();
  a.y.data = Addr(0x100000 + 2 * 10);  // overlaps x, not exactly
  ExpectInvalid(norm_->Forward(nullptr, a), "y: overlaps x");
  a = Good();
  a.residual = a.x;
  ExpectInvalid(norm_->Forward(nullptr, a), "residual:");
}

TEST_F(CompileOnlyRmsNormTest, BackwardNamesEveryBadArgument) {
  auto a = GoodBackward();
  a.workspace = nullptr;
  ExpectInvalid(norm_->Backward(nullptr, a), "workspace: null");
  a = GoodBackward();
  a.workspace = Addr(0x700004);
  ExpectInvalid(norm_->Backward(nullptr, a), "workspace:");
  a = GoodBackward();
  a.dw.data = nullptr;
  ExpectInvalid(norm_->Backward(nullptr, a), "dw: null");
  a = GoodBackward();
  a.dx = a.x;
  ExpectInvalid(norm_->Backward(nullptr, a), "dx: must not alias x");
  a = GoodBackward();
  a.rstd.cols = R - 1;
  ExpectInvalid(norm_->Backward(nullptr, a), "rstd: cols");
  a = GoodBackward();
  a.dx.data = a.dy.data;  // in place is allowed: reaches the compile-only error
  EXPECT_EQ(norm_->Backward(nullptr, a).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CompileOnlyRuntimeTest, NeedsAnExplicitValidTarget) {
  auto rt = Runtime::Create({.compile_only = true});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
  rt = Runtime::Create({.target = "sm_9", .compile_only = true});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kjit
