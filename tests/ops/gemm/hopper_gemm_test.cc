// kjit's Hopper GEMM on the CPU: its config's text form and limits, which arguments it takes (and
// why not the others), and NVRTC compiles of the template for sm_90a in every layout the lm_head
// needs, both 16-bit dtypes, fp32 output and accumulation.
#include <string>

#include <gtest/gtest.h>

#include "jit/jit.h"
#include "jit/status_helpers.h"
#include "ops/gemm/config.h"
#include "ops/gemm/hopper_gemm.h"

namespace kjit::ops {
namespace {

TEST(GemmConfig, TextRoundTripsAndTheDefaultIsValid) {
  const GemmConfig def = DefaultGemmConfig(8192, 128256, 4096);
  EXPECT_TRUE(ValidateGemmConfig(def).ok());
  EXPECT_EQ(def.ToString(), "tile_m=128 tile_n=256 stages=4 group=8 along_n=0");
  const GemmConfig other{.tile_m = 256, .tile_n = 128, .stages = 3, .group = 16, .along_n = true};
  auto parsed = ParseGemmConfig(other.ToString());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, other);
  EXPECT_EQ(GemmSharedBytes(def), 4 * (128 + 256) * 128 + 4 * 16 + 1024);
}

TEST(GemmConfig, RefusesWhatCannotRunNamingTheField) {
  auto refused = [](GemmConfig c, const char* field) {
    const absl::Status s = ValidateGemmConfig(c);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.ToString();
    EXPECT_NE(ToStd(s.message()).find(field), std::string::npos) << s;
  };
  refused({.tile_m = 96}, "tile_m");
  refused({.tile_n = 192}, "tile_n");
  refused({.tile_m = 256, .tile_n = 256}, "accumulator registers");  // 4 warpgroups x 128 each
  refused({.stages = 1}, "stages");
  refused({.stages = 5}, "stages");  // 5 x 48 KB is over 227 KB
  refused({.group = 0}, "group");
  EXPECT_FALSE(ParseGemmConfig("tile_m=128 tile_n=256 stages=4 group=8 along_n=2").ok());
  EXPECT_FALSE(ParseGemmConfig("tile_m=128 tile_n=256 stages=4 group=8").ok());
}

// A fake 16-byte-aligned device address: Supports reads no memory.
void* At(uintptr_t a) { return reinterpret_cast<void*>(a); }

TEST(HopperGemm, SupportsTheLmHeadsGemmsAndSaysWhyNotOthers) {
  const jit::Target sm90 = *jit::ParseTarget("sm_90");
  const int64_t rows = 1000, vocab = 128256, hidden = 4096;
  const TensorView h = TensorView::Matrix(At(0x10000), DType::kBF16, rows, hidden);
  const TensorView w = TensorView::Matrix(At(0x20000), DType::kBF16, vocab, hidden);
  const TensorView dl = TensorView::Matrix(At(0x30000), DType::kBF16, rows, vocab);
  const TensorView dh = TensorView::Matrix(At(0x40000), DType::kBF16, rows, hidden);
  const TensorView dw = TensorView::Matrix(At(0x50000), DType::kF32, vocab, hidden);
  const GemmArgs logits{.a = h, .b = w, .transpose_b = true, .out = dl};
  const GemmArgs d_hidden{.a = dl, .b = w, .out = dh};
  const GemmArgs d_weight{.a = dl, .transpose_a = true, .b = h, .out = dw, .beta = 1};
  for (const GemmArgs& g : {logits, d_hidden, d_weight}) {
    EXPECT_TRUE(HopperGemm::Supports(g, sm90).ok()) << HopperGemm::Supports(g, sm90);
  }
  EXPECT_EQ(KernelSpecOf(logits, {}).NameExpression(),
            "kjit::gemm_sm90<kjit::bf16, kjit::bf16, 128, 256, 4, 0, 0, 8, false, false>");
  EXPECT_EQ(KernelSpecOf(d_weight, {}).NameExpression(),
            "kjit::gemm_sm90<kjit::bf16, float, 128, 256, 4, 1, 1, 8, false, true>");

  auto why_not = [&](const GemmArgs& g, const jit::Target& t, const char* reason) {
    const absl::Status s = HopperGemm::Supports(g, t);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << reason;
    EXPECT_NE(ToStd(s.message()).find(reason), std::string::npos) << s;
  };
  why_not(logits, *jit::ParseTarget("sm_100"), "sm_100");
  GemmArgs odd_vocab = d_hidden;  // rows of 32001 bf16 logits are 64002 bytes apart
  odd_vocab.a = TensorView::Matrix(At(0x30000), DType::kBF16, rows, 32001);
  odd_vocab.b = TensorView::Matrix(At(0x20000), DType::kBF16, 32001, hidden);
  why_not(odd_vocab, sm90, "64002 bytes");
  GemmArgs misaligned = logits;
  misaligned.a.data = At(0x10008);
  why_not(misaligned, sm90, "16-byte");
  GemmArgs with_bias = logits;
  with_bias.bias = TensorView::Vector(At(0x60000), DType::kBF16, vocab);
  why_not(with_bias, sm90, "bias");
  GemmArgs scaled = d_weight;
  scaled.beta = 0.5f;
  why_not(scaled, sm90, "beta");
  GemmArgs f32 = logits;
  f32.a.dtype = f32.b.dtype = f32.out.dtype = DType::kF32;
  why_not(f32, sm90, "fp32");
  GemmArgs wrong_shape = logits;
  wrong_shape.out.cols = 7;
  EXPECT_EQ(HopperGemm::Supports(wrong_shape, sm90).code(), absl::StatusCode::kInvalidArgument);
}

// The template compiles with NVRTC for sm_90a (no GPU): the three lm_head layouts in bf16, fp16
// with the other tile shapes, fp32 output with accumulation.
TEST(HopperGemm, TemplateCompilesForSm90aInEveryLayout) {
  auto jit = jit::Jit::Create({.use_disk_cache = false});
  ASSERT_TRUE(jit.ok()) << jit.status();
  const GemmConfig tall{.tile_m = 256, .tile_n = 128, .stages = 4, .group = 4};
  const GemmKernelSpec specs[] = {{.dtype = DType::kBF16, .out = DType::kBF16},
                                  {.dtype = DType::kBF16, .out = DType::kBF16, .b_major_mn = true},
                                  {.dtype = DType::kBF16,
                                   .out = DType::kF32,
                                   .a_major_mn = true,
                                   .b_major_mn = true,
                                   .accumulate = true},
                                  {.dtype = DType::kF16,
                                   .out = DType::kF16,
                                   .a_major_mn = true,
                                   .b_major_mn = true,
                                   .config = tall},
                                  {.dtype = DType::kF16,
                                   .out = DType::kF16,
                                   .config = {.tile_m = 64, .stages = 3, .along_n = true}}};
  for (const GemmKernelSpec& spec : specs) {
    auto source = RenderGemm(spec);
    ASSERT_TRUE(source.ok()) << source.status();
    auto built = (*jit)->Build(*source, GemmTarget());
    ASSERT_TRUE(built.ok()) << spec.NameExpression() << ": " << built.status();
    EXPECT_EQ(built->binary->target.ToString(), "sm_90a");
    EXPECT_GT(built->binary->code.size(), 1000u) << spec.NameExpression();
  }
}

}  // namespace
}  // namespace kjit::ops
