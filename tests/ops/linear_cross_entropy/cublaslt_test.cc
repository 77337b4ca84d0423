// Loading cuBLASLt for the fused linear + cross-entropy: the candidates ($KJIT_CUBLASLT_PATH
// alone when set), the error naming every candidate tried and the variable, and a load from the
// loader's path where the machine has one.
#include "kjit/linear_cross_entropy.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "ops/linear_cross_entropy/cublaslt.h"
#include "tests/ops/linear_cross_entropy/test_support.h"

namespace kjit {
namespace {

using testing::Contains;

// CublasLt::Get() remembers its first answer for the process, so the failing load runs in a
// child that starts afresh: a "threadsafe" death test re-executes this binary for this test
// alone, where nothing has called Get() yet.
void LoadFromANonexistentPathAndExit() {
  ::setenv("KJIT_CUBLASLT_PATH", "/nonexistent/libcublasLt.so", 1);
  const auto lt = ops::CublasLt::Get();
  const absl::Status s = lt.status();
  const std::string message(ToStd(s.message()));
  std::fprintf(stderr, "status: %s\n", s.ToString().c_str());
  const bool right = s.code() == absl::StatusCode::kFailedPrecondition &&
                     message.find("KJIT_CUBLASLT_PATH") != std::string::npos &&
                     message.find("/nonexistent/libcublasLt.so") != std::string::npos;
  std::fprintf(stderr, "%s\n", right ? "verdict: right" : "verdict: WRONG");
  std::fflush(stderr);
  std::_Exit(right ? 0 : 1);
}

TEST(LinearCrossEntropyCublasLtTest, ANonexistentPathIsAFailedPreconditionNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(LoadFromANonexistentPathAndExit(), ::testing::ExitedWithCode(0), "verdict: right");
}

// $KJIT_CUBLASLT_PATH alone when set (a typo is an error, not a silent fallback); else the
// sonames, then the toolkit's own copy for a machine whose loader path lacks it.
TEST(LinearCrossEntropyCublasLtTest, DefaultCandidatesFollowTheVariable) {
  const char* saved = std::getenv("KJIT_CUBLASLT_PATH");
  const std::string restore = saved ? saved : "";
  ::setenv("KJIT_CUBLASLT_PATH", "/opt/x/libcublasLt.so", 1);
  EXPECT_EQ(ops::CublasLt::DefaultCandidates(), std::vector<std::string>{"/opt/x/libcublasLt.so"});
  ::unsetenv("KJIT_CUBLASLT_PATH");
  const std::vector<std::string> names = ops::CublasLt::DefaultCandidates();
  ASSERT_EQ(names.size(), 4u);
  EXPECT_EQ(names.front(), "libcublasLt.so.13");
  EXPECT_EQ(names.back(), "/usr/local/cuda/lib64/libcublasLt.so");
  if (saved != nullptr) ::setenv("KJIT_CUBLASLT_PATH", restore.c_str(), 1);
}

TEST(LinearCrossEntropyCublasLtTest, LoadNamesEveryCandidateTried) {
  auto lt = ops::CublasLt::Load({"/nonexistent/a/libcublasLt.so", "/nonexistent/b/libcublasLt.so"});
  ASSERT_FALSE(lt.ok());
  EXPECT_EQ(lt.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Contains(lt.status(), "/nonexistent/a/libcublasLt.so")) << lt.status();
  EXPECT_TRUE(Contains(lt.status(), "/nonexistent/b/libcublasLt.so")) << lt.status();
  EXPECT_TRUE(Contains(lt.status(), "KJIT_CUBLASLT_PATH")) << lt.status();
}

TEST(LinearCrossEntropyCublasLtTest, LoadsFromTheLoadersPath) {
  if (const char* env = std::getenv("KJIT_CUBLASLT_PATH"); env != nullptr && *env != '\0') {
    GTEST_SKIP() << "KJIT_CUBLASLT_PATH is set (" << env << "): the loader's path is not used";
  }
  auto lt = ops::CublasLt::Get();
  if (!lt.ok() && Contains(lt.status(), "could not load")) {
    GTEST_SKIP() << "no libcublasLt on this machine's loader path: " << lt.status();
  }
  ASSERT_TRUE(lt.ok()) << lt.status();
  EXPECT_GT((*lt)->version(), 0u);
  EXPECT_GE((*lt)->cudart_version(), 12000u) << "cuBLASLt 12 or newer";
  EXPECT_NE((*lt)->path().find("libcublasLt"), std::string::npos) << (*lt)->path();
  // Every entry point the op calls was found.
  EXPECT_NE((*lt)->cublasLtCreate, nullptr);
  EXPECT_NE((*lt)->cublasLtMatmul, nullptr);
  EXPECT_NE((*lt)->cublasLtMatmulAlgoGetHeuristic, nullptr);
  EXPECT_NE((*lt)->cublasLtGetStatusString, nullptr);
  // Cached: the same object every time.
  auto again = ops::CublasLt::Get();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lt);
}

}  // namespace
}  // namespace kjit
