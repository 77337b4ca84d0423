// examples/finetune_step on a machine without a GPU: it starts (cuBLASLt is linked, the driver is
// not), rejects bad flags as usage errors, exits 77 (skipped) with a clear message when there is no
// usable driver, and its baseline kernels compile through NVRTC for the archs kjit targets. The
// runs themselves are GPU work: scripts/gpu/finetune.sh.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "bench/finetune_step/eager_kernels.h"
#include "runtime/runtime_state.h"
#include "tests/test_support.h"

#ifndef KJIT_FINETUNE_STEP_PATH
#error "KJIT_FINETUNE_STEP_PATH must name the built finetune_step binary"
#endif

namespace finetune {
namespace {

namespace fs = std::filesystem;
using kjit::testing::CliResult;

using kjit::testing::Contains;

class FinetuneStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kjit_finetune_test_XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr) << std::strerror(errno);
    root_ = tmpl;
    env_["KJIT_CACHE_DIR"] = root_ + "/cache";
    // "No GPU" the same way on a machine that has one.
    env_["KJIT_LIBCUDA_PATH"] = root_ + "/no-libcuda.so";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  CliResult Run(const std::vector<std::string>& args) {
    return kjit::testing::RunProgram(KJIT_FINETUNE_STEP_PATH, args, env_, root_);
  }

  std::string root_;
  std::map<std::string, std::string> env_;
};

TEST_F(FinetuneStepTest, WithoutADriverItIsSkippedSayingWhy) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{}, {"--model", "llama-3.2-1b", "--batch", "1", "--seq", "256"}}) {
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 77) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "skipped: this example needs a GPU")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "libcuda")) << r.Describe();
    EXPECT_EQ(r.out, "") << r.Describe();
  }
}

TEST_F(FinetuneStepTest, TheStubDriverIsSkippedToo) {
  env_["KJIT_LIBCUDA_PATH"] = kjit::testing::StubLibcuda();
  CliResult r = Run({"--json"});
  EXPECT_EQ(r.exit_code, 77) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "CUDA_ERROR_STUB_LIBRARY")) << r.Describe();
}

TEST_F(FinetuneStepTest, BadFlagsAreUsageErrorsNamingTheFlag) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--seq", "1"}, "--seq"},
      {{"--batch", "0"}, "--batch"},
      {{"--steps", "0"}, "--steps"},
      {{"--model", "no-such-model"}, "no preset named 'no-such-model'"},
      {{"--model", "gemma-2-9b"}, "--model gemma-2-9b: uses Gemma-style RMSNorm"},
      {{"--model", "mistral-7b", "--config", "config.json"}, "--model and --config"},
      {{"--batch", "65536", "--seq", "65536"}, "--batch x --seq"},
  };
  for (const auto& [args, message] : cases) {
    CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << args[0] << "\n" << r.Describe();
    EXPECT_TRUE(Contains(r.all(), message)) << message << "\n" << r.Describe();
  }
}

TEST_F(FinetuneStepTest, AnUnreadableConfigFails) {
  CliResult r = Run({"--config", root_ + "/missing.json"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "missing.json")) << r.Describe();
}

TEST_F(FinetuneStepTest, HelpListsTheFlags) {
  CliResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  for (const char* flag : {"--batch", "--seq", "--model", "--config", "--steps", "--chunk-rows",
                           "--json", "--trace"}) {
    EXPECT_TRUE(Contains(r.out, flag)) << flag << "\n" << r.Describe();
  }
}

// Every instantiation the baseline launches compiles, for both vector widths, to CUBIN for the
// H200's sm_90 and for sm_100.
TEST_F(FinetuneStepTest, BaselineKernelsCompileWithNvrtc) {
  for (const char* target : {"sm_90", "sm_100"}) {
    auto rt = kjit::Runtime::Create({.target = target, .compile_only = true, .disk_cache = false});
    ASSERT_TRUE(rt.ok()) << rt.status();
    for (int vec : {1, 4}) {
      auto src = EagerKernelsSource(vec);
      ASSERT_TRUE(src.ok()) << src.status();
      auto built =
          kjit::internal::StateOf(*rt).jit->Build(*src, kjit::internal::StateOf(*rt).target);
      ASSERT_TRUE(built.ok()) << target << " vec " << vec << ": " << built.status();
      EXPECT_EQ(built->binary->lowered_names.size(), src->name_expressions.size());
    }
  }
  EXPECT_FALSE(EagerKernelsSource(2).ok());
}

}  // namespace
}  // namespace finetune
