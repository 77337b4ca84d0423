#include "jit/target.h"

#include <gtest/gtest.h>

#include "jit/status_helpers.h"

namespace kjit::jit {
namespace {

TEST(TargetTest, ParsesAndPrintsEveryForm) {
  for (const char* text : {"sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a",
                           "sm_103", "sm_120", "compute_90", "compute_100"}) {
    auto t = ParseTarget(text);
    ASSERT_TRUE(t.ok()) << text << ": " << t.status();
    EXPECT_EQ(t->ToString(), text);
  }
  auto t = ParseTarget("compute_90");
  EXPECT_EQ(t->kind, Target::Kind::kPtx);
  EXPECT_EQ(t->arch, 90);
  EXPECT_EQ(ParseTarget("sm_100a")->arch_specific, true);
  EXPECT_EQ(ParseTarget("sm_90")->GpuArchitectureOption(), "--gpu-architecture=sm_90");
}

TEST(TargetTest, RejectsMalformedWithTheAcceptedForms) {
  for (const char* text : {"", "sm_", "sm90", "sm_9x", "gfx90a", "sm_5", "sm_-90", "compute_",
                           "sm_90aa", "SM_90", "sm_1000"}) {
    auto t = ParseTarget(text);
    ASSERT_FALSE(t.ok()) << text;
    EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(ToStd(t.status().message()).find("arch:"), std::string_view::npos) << t.status();
  }
}

TEST(TargetTest, DeviceArchSupportedGivesCubin) {
  auto t = SelectTargetForDevice(90, {75, 80, 90, 100, 120}, 13000, 13000);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->ToString(), "sm_90");
}

TEST(TargetTest, UnsupportedArchFallsBackToPtxOnlyWhenTheDriverIsNewEnough) {
  // An sm_100 GPU with an NVRTC that stops at sm_90 (CUDA 12.6-like).
  auto ptx = SelectTargetForDevice(100, {75, 80, 86, 89, 90}, 12060, 12080);
  ASSERT_TRUE(ptx.ok()) << ptx.status();
  EXPECT_EQ(ptx->ToString(), "compute_90");
  // The same with a driver older than NVRTC: PTX would be refused, so it is an error with a fix.
  auto none = SelectTargetForDevice(100, {75, 80, 86, 89, 90}, 12060, 12040);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(ToStd(none.status().message()).find("CUDA_ERROR_UNSUPPORTED_PTX_VERSION"),
            std::string_view::npos);
}

TEST(TargetTest, NoArchAtOrBelowTheDeviceIsAnError) {
  auto t = SelectTargetForDevice(70, {75, 80, 90}, 13000, 13000);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TargetTest, CheckNvrtcSupportsNamesTheArchAndTheFix) {
  EXPECT_TRUE(CheckNvrtcSupports(*ParseTarget("sm_90"), {80, 90}).ok());
  absl::Status s = CheckNvrtcSupports(*ParseTarget("sm_100"), {80, 90});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(ToStd(s.message()).find("sm_100"), std::string_view::npos);
  EXPECT_NE(ToStd(s.message()).find("12.8"), std::string_view::npos);
}

}  // namespace
}  // namespace kjit::jit
