// NVRTC compiles of the fused linear + cross-entropy's own kernels without a GPU: the embedded
// templates, the kernels the plan needs, every arch, dtype, reduction and weight-gradient dtype,
// the rescale program and the options.
#include "kjit/linear_cross_entropy.h"

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include "jit/compiler.h"
#include "jit/dtype.h"
#include "jit/embedded_templates.h"
#include "jit/source.h"
#include "ops/linear_cross_entropy/program.h"
#include "tests/expect_status.h"

namespace kjit {
namespace {

using testing::ExpectInvalid;

const jit::Nvrtc& GetNvrtc() {
  auto n = jit::Nvrtc::Get();
  EXPECT_TRUE(n.ok()) << n.status();  // NVRTC is part of the CI machine's toolkit
  return **n;
}

void ExpectCompiles(const LinearCrossEntropySpec& spec, const char* arch) {
  auto src = ops::RenderLinearCrossEntropy(spec);
  ASSERT_TRUE(src.ok()) << src.status();
  const jit::Target target = *jit::ParseTarget(arch);
  auto bin = jit::Compile(GetNvrtc(), *src, target);
  ASSERT_TRUE(bin.ok()) << arch << " " << jit::FormatParams(src->params) << ": " << bin.status();
  EXPECT_EQ(bin->target, target);
  ASSERT_GE(bin->code.size(), 4u);
  EXPECT_EQ(bin->code.substr(0, 4),
            "\x7f"
            "ELF")
      << "CUBIN is an ELF image";
  ASSERT_EQ(bin->lowered_names.size(), src->name_expressions.size());
  for (const auto& [expr, lowered] : bin->lowered_names) {
    EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr << " -> " << lowered;
  }
}

TEST(LinearCrossEntropyCompileTest, TemplatesAreEmbeddedAndUseNoToolkitHeader) {
  for (const char* name : {"linear_cross_entropy.cuh", "linear_cross_entropy_params.h"}) {
    const std::string* text = jit::FindEmbeddedTemplate(name);
    ASSERT_NE(text, nullptr) << name;
    EXPECT_FALSE(text->empty()) << name;
    EXPECT_EQ(text->find("#include <"), std::string::npos) << name << " includes a system header";
    EXPECT_EQ(text->find("#include \"cuda"), std::string::npos)
        << name << " includes a toolkit header";
  }
}

TEST(LinearCrossEntropyCompileTest, RendersTheKernelsThePlanNeeds) {
  // count, scale, reduce; and the 4 stores into a d_weight that is not fp32.
  for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
    for (DType wg : {dt, DType::kF32}) {
      LinearCrossEntropySpec s{.vocab = 1000, .hidden = 64, .dtype = dt, .weight_grad_dtype = wg};
      auto src = ops::RenderLinearCrossEntropy(s);
      ASSERT_TRUE(src.ok()) << src.status();
      EXPECT_EQ(src->name_expressions.size(), wg == DType::kF32 ? 3u : 7u)
          << Name(dt) << " " << Name(wg);
      EXPECT_EQ(src->params.at("op"), "linear_cross_entropy");
      EXPECT_EQ(src->params.at("weight_grad_dtype"), Name(wg));
    }
  }
  // A bad spec is refused before rendering.
  auto bad = ops::RenderLinearCrossEntropy({.vocab = 1, .hidden = 64});
  ASSERT_FALSE(bad.ok());
  ExpectInvalid(bad.status(), "vocab:");
}

TEST(LinearCrossEntropyCompileTest, EveryArchDtypeReductionAndWeightGradDtype) {
  int compiled = 0;
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (Reduction r : {Reduction::kNone, Reduction::kSum, Reduction::kMean}) {
        for (DType wg : {dt, DType::kF32}) {
          const LinearCrossEntropySpec spec{.vocab = 128256,
                                            .hidden = 4096,
                                            .dtype = dt,
                                            .weight_grad_dtype = wg,
                                            .loss = {.reduction = r}};
          SCOPED_TRACE(fmt::format("{} {} {} weight_grad {}", arch, Name(dt), Name(r), Name(wg)));
          ExpectCompiles(spec, arch);
          if (::testing::Test::HasFatalFailure()) return;
          ++compiled;
          if (dt == DType::kF32) break;  // wg == dt: the fp32 case is the same program
        }
      }
    }
  }
  EXPECT_EQ(compiled, 4 * (3 * 2 + 3 * 2 + 3));
}

// RescaleGradients' program: scalar and 4-wide kernels per gradient dtype, the dtype's first.
TEST(LinearCrossEntropyCompileTest, RescaleProgramPerGradientDtype) {
  for (const char* arch : {"sm_80", "sm_90", "sm_100", "sm_120"}) {
    for (DType dt : {DType::kBF16, DType::kF16, DType::kF32}) {
      for (DType wg : {dt, DType::kF32}) {
        SCOPED_TRACE(fmt::format("{} {} weight_grad {}", arch, Name(dt), Name(wg)));
        const LinearCrossEntropySpec s{
            .vocab = 50257, .hidden = 4095, .dtype = dt, .weight_grad_dtype = wg};
        auto src = ops::RenderLinearCrossEntropyRescale(s);
        ASSERT_TRUE(src.ok()) << src.status();
        ASSERT_EQ(src->name_expressions.size(), wg == dt ? 2u : 4u);
        EXPECT_EQ(
            src->name_expressions[0],
            fmt::format("kjit::linear_cross_entropy_rescale<{}, 256, 1>", DeviceTypeName(dt)));
        EXPECT_EQ(
            src->name_expressions.back(),
            fmt::format("kjit::linear_cross_entropy_rescale<{}, 256, 4>", DeviceTypeName(wg)));
        auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget(arch));
        ASSERT_TRUE(bin.ok()) << bin.status();
        EXPECT_EQ(bin->lowered_names.size(), src->name_expressions.size());
        if (dt == DType::kF32) break;
      }
    }
  }
  auto bad = ops::RenderLinearCrossEntropyRescale({.vocab = 1, .hidden = 64});
  ASSERT_FALSE(bad.ok());
  ExpectInvalid(bad.status(), "vocab:");
}

// Options reach the count kernel (target type, ignore_index); cover them with an odd vocab.
TEST(LinearCrossEntropyCompileTest, Options) {
  for (int bits = 0; bits < 8; ++bits) {
    LinearCrossEntropySpec s{.vocab = 50257, .hidden = 1000, .dtype = DType::kBF16};
    s.loss.target_type = bits & 1 ? IndexType::kInt32 : IndexType::kInt64;
    s.bias = (bits & 2) != 0;
    s.loss.argmax = (bits & 4) != 0;
    s.loss.label_smoothing = bits & 2 ? 0.1f : 0.0f;
    s.loss.softcap = bits & 4 ? 30.0f : 0.0f;
    s.loss.z_loss = bits & 1 ? 1e-4f : 0.0f;
    s.loss.reduction = static_cast<Reduction>(bits % 3);
    SCOPED_TRACE(bits);
    ExpectCompiles(s, "sm_90");
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// Issue 45, defect 13: programs whose text differs are described apart (their params are what
// `kjit cache ls` shows).
TEST(LinearCrossEntropyCompileTest, ProgramsThatDifferHaveParamsThatDiffer) {
  std::vector<LinearCrossEntropySpec> specs(3, {.vocab = 50257, .hidden = 1000});
  specs[1].loss.label_smoothing = 0.1f;
  specs[2].loss.class_weight_dtype = DType::kF32;
  std::set<std::string> texts, described;
  for (const LinearCrossEntropySpec& s : specs) {
    auto src = ops::RenderLinearCrossEntropy(s);
    ASSERT_TRUE(src.ok()) << src.status();
    texts.insert(fmt::format("{}", fmt::join(src->name_expressions, ";")));
    described.insert(jit::FormatParams(src->params));
  }
  EXPECT_EQ(texts.size(), 3u);
  EXPECT_EQ(described.size(), 3u) << fmt::format("{}", fmt::join(described, "\n"));
}

}  // namespace
}  // namespace kjit
