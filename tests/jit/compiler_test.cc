// NVRTC compiles of the real templates on the CPU: every dtype pair, option and target that kjit
// promises, as CUBIN with the lowered names recorded, and a broken program reports its log.
#include "jit/compiler.h"

#include <string>

#include <absl/strings/cord.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "jit/embedded_templates.h"
#include "jit/status_helpers.h"
#include "kjit/rms_norm.h"
#include "ops/rms_norm/config.h"
#include "ops/rms_norm/program.h"

namespace kjit {
namespace {

const jit::Nvrtc& GetNvrtc() {
  auto n = jit::Nvrtc::Get();
  EXPECT_TRUE(n.ok()) << n.status();  // NVRTC is part of the CI machine's toolkit
  return **n;
}

TEST(CompilerTest, TemplatesAreEmbeddedAndUseNoToolkitHeader) {
  for (const char* name : {"common.cuh", "rms_norm.cuh", "rms_norm_params.h"}) {
    const std::string* text = jit::FindEmbeddedTemplate(name);
    ASSERT_NE(text, nullptr) << name;
    EXPECT_EQ(text->find("#include <"), std::string::npos) << name << " includes a system header";
    EXPECT_EQ(text->find("#include \"cuda"), std::string::npos)
        << name << " includes a toolkit header";
  }
}

TEST(CompilerTest, RmsNormCompilesForEveryDtypeAndTarget) {
  const jit::Nvrtc& nvrtc = GetNvrtc();
  int compiled = 0;
  for (const char* arch : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_103", "sm_120"}) {
    const jit::Target target = *jit::ParseTarget(arch);
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      // Casting none (the whole computation in the dtype) takes only a weight of the dtype.
      for (auto [w, casting] :
           {std::pair{t, RmsNormCasting::kLlama}, std::pair{DType::kF32, RmsNormCasting::kLlama},
            std::pair{t, RmsNormCasting::kNone}}) {
        RmsNormSpec spec{.hidden = 4096, .dtype = t, .weight_dtype = w, .casting = casting};
        const int vec =
            ops::MaxVecForHidden(4096, static_cast<int>(std::max(SizeOf(t), SizeOf(w))));
        auto src = ops::RenderRmsNorm(spec, ops::DefaultRmsNormConfig(4096, vec));
        ASSERT_TRUE(src.ok()) << src.status();
        auto bin = jit::Compile(nvrtc, *src, target);
        ASSERT_TRUE(bin.ok()) << arch << " " << Name(t) << "/" << Name(w) << " " << Name(casting)
                              << ": " << bin.status();
        EXPECT_EQ(bin->target, target);
        ASSERT_GE(bin->code.size(), 4u);
        EXPECT_EQ(bin->code.substr(0, 4),
                  "\x7f"
                  "ELF")
            << "CUBIN is an ELF image";
        ASSERT_EQ(bin->lowered_names.size(), 3u);
        for (const auto& [expr, lowered] : bin->lowered_names) {
          EXPECT_EQ(lowered.rfind("_Z", 0), 0u) << expr << " -> " << lowered;
        }
        ++compiled;
      }
    }
  }
  EXPECT_EQ(compiled, 7 * 3 * 3);
}

TEST(CompilerTest, EveryOptionAndOddShapeCompiles) {
  const jit::Nvrtc& nvrtc = GetNvrtc();
  const jit::Target target = *jit::ParseTarget("sm_90");
  for (int64_t hidden : {1, 7, 64, 1000, 5120, 65536}) {
    for (int bits = 0; bits < 6; ++bits) {
      RmsNormSpec spec{.hidden = hidden,
                       .dtype = DType::kBF16,
                       .casting = static_cast<RmsNormCasting>(bits / 2),  // llama, gemma, none
                       .fused_residual = (bits & 1) != 0};
      for (int vec : {1, ops::MaxVecForHidden(hidden, 2)}) {
        auto src = ops::RenderRmsNorm(spec, ops::DefaultRmsNormConfig(hidden, vec));
        ASSERT_TRUE(src.ok()) << src.status();
        auto bin = jit::Compile(nvrtc, *src, target);
        ASSERT_TRUE(bin.ok()) << "hidden=" << hidden << " bits=" << bits << " vec=" << vec << ": "
                              << bin.status();
      }
    }
  }
}

TEST(CompilerTest, PtxTargetGivesPtxText) {
  auto src = ops::RenderRmsNorm({.hidden = 64}, ops::DefaultRmsNormConfig(64, 8));
  ASSERT_TRUE(src.ok());
  auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget("compute_90"));
  ASSERT_TRUE(bin.ok()) << bin.status();
  EXPECT_NE(bin->code.find(".target sm_90"), std::string::npos);
}

TEST(CompilerTest, CompileErrorCarriesLogOptionsTargetAndParams) {
  jit::Source src;
  src.name = "broken";
  src.text = "#include \"common.cuh\"\n__global__ void k(int* p) { *p = undeclared_thing; }\n";
  src.headers = {{"common.cuh", *jit::FindEmbeddedTemplate("common.cuh")}};
  src.name_expressions = {"k"};
  src.params = {{"hidden", "123"}};
  auto bin = jit::Compile(GetNvrtc(), src, *jit::ParseTarget("sm_90"));
  ASSERT_FALSE(bin.ok());
  const std::string msg(ToStd(bin.status().message()));
  EXPECT_NE(msg.find("undeclared_thing"), std::string::npos) << msg;   // the NVRTC log
  EXPECT_NE(msg.find("--gpu-architecture=sm_90"), std::string::npos);  // the options
  EXPECT_NE(msg.find("for sm_90"), std::string::npos);                 // the target
  EXPECT_NE(msg.find("hidden=123"), std::string::npos);                // the op's parameters
  EXPECT_TRUE(bin.status().GetPayload(jit::kCompileLogPayload).has_value());
}

// Issue 34 (5): ptxas's part of the log brings a NUL of its own, which reached the message: C and
// Python callers saw it cut, `kjit compile --json` held \u0000.
TEST(CompilerTest, NoNulOfTheLogReachesTheMessage) {
  auto src =
      ops::RenderRmsNorm({.hidden = 64, .dtype = DType::kBF16}, ops::DefaultRmsNormConfig(64, 8));
  ASSERT_TRUE(src.ok()) << src.status();
  // jit::Compile does not know bf16 needs sm_80 (the ops refuse it before): ptxas fails.
  auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget("sm_75"));
  ASSERT_FALSE(bin.ok());
  const std::string msg(ToStd(bin.status().message()));
  EXPECT_NE(msg.find("ptxas fatal"), std::string::npos) << msg;  // the log's last line is kept
  EXPECT_EQ(msg.find('\0'), std::string::npos) << msg;
  const auto log = bin.status().GetPayload(jit::kCompileLogPayload);
  ASSERT_TRUE(log.has_value());
  EXPECT_EQ(std::string(*log).find('\0'), std::string::npos);
}

TEST(CompilerTest, TargetNvrtcLacksIsRefusedBeforeCompiling) {
  auto src = ops::RenderRmsNorm({.hidden = 64}, ops::DefaultRmsNormConfig(64, 8));
  ASSERT_TRUE(src.ok());
  auto bin = jit::Compile(GetNvrtc(), *src, *jit::ParseTarget("sm_999"));
  ASSERT_FALSE(bin.ok());
  EXPECT_EQ(bin.status().code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace kjit
