// The default warning sink: each distinct message once per process, on stderr.
#include "jit/warnings.h"

#include <gtest/gtest.h>

namespace kjit::jit {
namespace {

TEST(WarnOnceToStderr, SaysEachDistinctMessageOnce) {
  ::testing::internal::CaptureStderr();
  WarnOnceToStderr("warnings_test: first");
  WarnOnceToStderr("warnings_test: second");
  WarnOnceToStderr("warnings_test: first");
  EXPECT_EQ(::testing::internal::GetCapturedStderr(),
            "kjit: warning: warnings_test: first\nkjit: warning: warnings_test: second\n");
}

}  // namespace
}  // namespace kjit::jit
