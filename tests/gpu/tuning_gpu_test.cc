// Tuned configs on the GPU: an op launches the tuning database's config for the row bucket of the
// launch (the nearest tuned one when its own is missing), its results still match the reference,
// records of another device or a corrupt database leave it on the heuristic, and the trials the
// tuner times reject a wrong kernel.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "autotune/gpu_timer.h"
#include "jit/status_helpers.h"
#include "kjit/device_buffer.h"
#include "ops/common/tuning/trial.h"
#include "ops/cross_entropy/config.h"
#include "ops/registry.h"
#include "runtime/runtime_state.h"
#include "runtime/tuning_db.h"
#include "tests/gpu/gpu_test_env.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit {
namespace {

namespace fs = std::filesystem;
using internal::TuningDb;
using internal::TuningRecord;
using ops::TuningKeyFor;

class TuningGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    db_ = tmp_.path() + "/tuning.json";
  }
  void Put(const internal::TuningKey& key, const std::string& config) {
    TuningRecord r{
        .key = key, .config = config, .median_us = 1, .tuned_at = "2026-12-02T00:00:00Z"};
    auto written = TuningDb::Upsert(db_, {r});
    ASSERT_TRUE(written.ok()) << written.status();
  }
  testing::TempDir tmp_{"kjit_tuning_gpu"};
  std::string db_;
};

// A budget stops a candidate's repeats once they have taken it (after the minimum), and without
// one every repeat runs: a 64 MiB copy takes ~30 us, so a 1 us budget is spent by the first.
TEST(GpuTimerGpu, ABudgetStopsTheRepeatsAfterTheMinimum) {
  KJIT_REQUIRE_GPU(gpu);
  ASSERT_OK_AND_ASSIGN(auto timer, autotune::GpuTimer::Create(gpu));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer src, DeviceBuffer::Create(gpu, size_t{64} << 20));
  ASSERT_OK_AND_ASSIGN(DeviceBuffer dst, DeviceBuffer::Create(gpu, size_t{64} << 20));
  int launches = 0;
  auto copy = [&] {
    ++launches;
    return dst.CopyFrom(src);
  };
  ASSERT_OK_AND_ASSIGN(autotune::Timing all, timer->Time(40, copy));
  EXPECT_EQ(all.repeats, 40);
  EXPECT_EQ(launches, 41);  // one untimed first
  launches = 0;
  ASSERT_OK_AND_ASSIGN(autotune::Timing budgeted, timer->Time(40, copy, nullptr, /*budget_us=*/1));
  EXPECT_EQ(budgeted.repeats, autotune::GpuTimer::kMinBudgetedRepeats);
  EXPECT_EQ(launches, autotune::GpuTimer::kMinBudgetedRepeats + 1);
  EXPECT_GT(budgeted.median_us, 0);
  ASSERT_OK_AND_ASSIGN(autotune::Timing roomy, timer->Time(12, copy, nullptr, 1e9));
  EXPECT_EQ(roomy.repeats, 12);
}

TEST_F(TuningGpu, CrossEntropyLaunchesTheTunedConfigOfItsRowBucket) {
  KJIT_REQUIRE_GPU(gpu);
  const CrossEntropySpec spec{.vocab = 32000, .dtype = DType::kBF16};
  const std::string at_4096 = "vec=8 threads=256 unroll=2 cluster=0 staged=0";
  const std::string at_64 = "vec=8 threads=128 unroll=8 cluster=0 staged=0";
  Put(TuningKeyFor(gpu, spec, 4096), at_4096);
  Put(TuningKeyFor(gpu, spec, 64), at_64);
  internal::TuningKey elsewhere = TuningKeyFor(gpu, spec, 512);
  elsewhere.device = "Some Other GPU";
  Put(elsewhere, "vec=8 threads=1024 unroll=1 cluster=0 staged=0");

  auto rt = Runtime::Create({.tuning_db = db_});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto ce = rt->CrossEntropy(spec);
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_EQ(ce->ConfigFor(4096).ToString(), at_4096);
  EXPECT_EQ(ce->ConfigFor(3000).ToString(), at_4096) << "3000 rows fall in the 4096 bucket";
  EXPECT_EQ(ce->ConfigFor(50).ToString(), at_64);
  // 512 is tuned only for another device: the nearest of this device's buckets wins (64 and 4096
  // are 3 powers of two away; ties go to the larger).
  EXPECT_EQ(ce->ConfigFor(512).ToString(), at_4096);
  EXPECT_EQ(ce->config(), ops::DefaultCrossEntropyConfig(32000, 8, gpu.arch(), 2))
      << "config() stays the heuristic's";
  EXPECT_EQ(ce->ConfigFor(4096, /*fused=*/false), ce->config())
      << "the streaming launches have their own record (none here)";

  // The launch runs the tuned kernels and is still right.
  auto trial = ops::CrossEntropyTrial::Create(*rt, spec, 3000);
  ASSERT_TRUE(trial.ok()) << trial.status();
  EXPECT_TRUE((*trial)->Check(*ce, ops::Pass::kForwardBackward).ok())
      << (*trial)->Check(*ce, ops::Pass::kForwardBackward);

  // Without the database (or with it off) the same op is the heuristic's at every row count.
  auto off = Runtime::Create({.tuning_db = "off"});
  ASSERT_TRUE(off.ok());
  auto plain = off->CrossEntropy(spec);
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ConfigFor(4096), plain->config());
}

TEST_F(TuningGpu, RmsNormLaunchesTheTunedConfigAndSizesItsWorkspaceForIt) {
  KJIT_REQUIRE_GPU(gpu);
  const RmsNormSpec spec{.hidden = 4096, .dtype = DType::kBF16, .fused_residual = true};
  const std::string tuned = "vec=8 fwd=512x1 bwd=128x1";
  Put(TuningKeyFor(gpu, spec, 1000), tuned);
  auto rt = Runtime::Create({.tuning_db = db_});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto norm = rt->RmsNorm(spec);
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_EQ(norm->ConfigFor(1000).ToString(), tuned);
  // The non-residual op is another key: untouched.
  auto plain = rt->RmsNorm({.hidden = 4096, .dtype = DType::kBF16});
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->ConfigFor(1000), plain->config());
  auto trial = ops::RmsNormTrial::Create(*rt, spec, 1000);
  ASSERT_TRUE(trial.ok()) << trial.status();
  EXPECT_TRUE((*trial)->Check(*norm, ops::Pass::kForwardBackward).ok())
      << (*trial)->Check(*norm, ops::Pass::kForwardBackward);
}

TEST_F(TuningGpu, ACorruptDatabaseOrARecordThatDoesNotFitLeavesTheHeuristic) {
  KJIT_REQUIRE_GPU(gpu);
  const CrossEntropySpec spec{.vocab = 32000, .dtype = DType::kBF16};
  std::ofstream(db_) << "{\"format\": \"kjit-tuning-db\", \"version\": 1, \"records\": [";
  // Both warnings reach the runtime's sink, not stderr.
  std::vector<std::string> warnings;
  const WarningSink sink = [&](std::string_view m) { warnings.emplace_back(m); };
  auto rt = Runtime::Create({.tuning_db = db_, .warnings = sink});
  ASSERT_TRUE(rt.ok()) << rt.status();
  EXPECT_EQ(internal::StateOf(*rt).Tuning(), nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("ignoring the tuning database"), std::string::npos) << warnings[0];
  auto ce = rt->CrossEntropy(spec);
  ASSERT_TRUE(ce.ok());
  EXPECT_EQ(ce->ConfigFor(4096), ce->config());

  // Parses, but 16 elements per vector is not a bf16 config: ignored with a warning.
  fs::remove(db_);
  Put(TuningKeyFor(gpu, spec, 4096), "vec=16 threads=256 unroll=2 cluster=0 staged=0");
  warnings.clear();
  auto rt2 = Runtime::Create({.tuning_db = db_, .warnings = sink});
  ASSERT_TRUE(rt2.ok());
  auto ce2 = rt2->CrossEntropy(spec);
  ASSERT_TRUE(ce2.ok());
  EXPECT_EQ(ce2->ConfigFor(4096), ce2->config());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("\"vec=16 threads=256 unroll=2 cluster=0 staged=0\" ignored"),
            std::string::npos)
      << warnings[0];
}

// KJIT_AUTOTUNE: the first launch at an untuned bucket runs kjit-tune for that op (a child
// process), the database gains the record, and the launch uses it. Needs the kjit-tune binary:
// KJIT_TUNE_BIN (scripts/gpu/check.sh sets it).
TEST_F(TuningGpu, AutotuneTunesANewBucketAtItsFirstLaunch) {
  KJIT_REQUIRE_GPU(gpu);
  const char* bin = std::getenv("KJIT_TUNE_BIN");
  if (bin == nullptr || ::access(bin, X_OK) != 0) {
    GTEST_SKIP() << "KJIT_TUNE_BIN does not name an executable kjit-tune";
  }
  const CrossEntropySpec spec{.vocab = 4096, .dtype = DType::kBF16};
  auto rt = Runtime::Create({.tuning_db = db_, .autotune = true});
  ASSERT_TRUE(rt.ok()) << rt.status();
  auto ce = rt->CrossEntropy(spec);
  ASSERT_TRUE(ce.ok()) << ce.status();
  EXPECT_FALSE(TuningDb::Load(db_)->Find(TuningKeyFor(*rt, spec, 300)).has_value());
  auto trial = ops::CrossEntropyTrial::Create(*rt, spec, 300);
  ASSERT_TRUE(trial.ok()) << trial.status();
  EXPECT_TRUE((*trial)->Check(*ce, ops::Pass::kForwardBackward).ok())
      << (*trial)->Check(*ce, ops::Pass::kForwardBackward);  // the launch that tunes
  auto db = TuningDb::Load(db_);
  ASSERT_TRUE(db.ok()) << db.status();
  const auto record = db->Find(TuningKeyFor(*rt, spec, 300));
  ASSERT_TRUE(record.has_value()) << db->Serialize();
  EXPECT_EQ(record->key.rows_bucket, 512);
  EXPECT_GT(record->candidates, 1);
  EXPECT_EQ(ce->ConfigFor(300).ToString(), record->config);
  internal::TuningKey streaming = TuningKeyFor(*rt, spec, 300);
  streaming.op = ops::OpTrait<CrossEntropySpec>::StreamingTuningOp(spec);
  const auto forward = db->Find(streaming);
  ASSERT_TRUE(forward.has_value()) << "the same run tunes the forward-only launches";
  EXPECT_EQ(ce->ConfigFor(300, /*fused=*/false).ToString(), forward->config);
  // The same bucket again: no second tuning run (the record's tuned_at stays).
  EXPECT_TRUE((*trial)->Check(*ce, ops::Pass::kForwardBackward).ok());
  EXPECT_EQ(TuningDb::Load(db_)->Find(TuningKeyFor(*rt, spec, 300))->tuned_at, record->tuned_at);
}

// kjit-tune --device: tunes on the GPU it names (its workers too), and a GPU that is not there
// is an error naming the flag rather than a compile-only run.
TEST_F(TuningGpu, KjitTuneTunesOnTheDeviceItIsGiven) {
  KJIT_REQUIRE_GPU(gpu);
  const char* bin = std::getenv("KJIT_TUNE_BIN");
  if (bin == nullptr || ::access(bin, X_OK) != 0) {
    GTEST_SKIP() << "KJIT_TUNE_BIN does not name an executable kjit-tune";
  }
  const std::string spec = ops::SpecToJson(RmsNormSpec{.hidden = 1024, .dtype = DType::kBF16});
  testing::CliResult r = testing::RunProgram(
      bin, {"--spec", spec, "--tokens", "64", "--device", "0", "--db", db_, "--json"}, {},
      tmp_.path());
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  // The report lists the compiled kernel, then one tuned entry per op and row bucket: here one.
  const auto report = nlohmann::json::parse(r.out);
  size_t tuned = 0;
  for (const auto& k : report["kernels"]) tuned += k["tuned"].get<bool>();
  EXPECT_EQ(tuned, 1u) << r.out;
  auto db = TuningDb::Load(db_);
  ASSERT_TRUE(db.ok()) << db.status();
  ASSERT_EQ(db->records().size(), 1u) << db->Serialize();
  EXPECT_EQ(db->records()[0].key.device, gpu.device().name);

  int count = 0;
  ASSERT_EQ(kjit::internal::StateOf(gpu).driver->cuDeviceGetCount(&count), CUDA_SUCCESS);
  r = testing::RunProgram(
      bin, {"--spec", spec, "--tokens", "64", "--device", std::to_string(count), "--db", db_}, {},
      tmp_.path());
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("--device " + std::to_string(count) + ":"), std::string::npos) << r.err;
  EXPECT_EQ(TuningDb::Load(db_)->records().size(), 1u) << "the failed run wrote nothing";
}

TEST_F(TuningGpu, TrialsRejectAWrongKernel) {
  KJIT_REQUIRE_GPU(gpu);
  // A cross-entropy op over a different vocab gives a shape error, not a pass; and an op with a
  // different label smoothing than the trial's spec computes other values, which the check sees.
  const CrossEntropySpec spec{.vocab = 4096, .dtype = DType::kBF16};
  auto trial = ops::CrossEntropyTrial::Create(gpu, spec, 64);
  ASSERT_TRUE(trial.ok()) << trial.status();
  auto right = gpu.CrossEntropy(spec);
  ASSERT_TRUE(right.ok());
  for (ops::Pass pass : {ops::Pass::kForwardBackward, ops::Pass::kForward}) {
    EXPECT_TRUE((*trial)->Check(*right, pass).ok()) << ops::Name(pass);
  }
  // Label smoothing changes the gradient (and the loss) but not lse: the forward's check, which
  // compares lse, needs another difference, a soft-cap.
  CrossEntropySpec smoothed = spec, capped = spec;
  smoothed.loss.label_smoothing = 0.1f;
  capped.loss.softcap = 4.0f;
  for (const auto& [other, pass] :
       {std::pair{smoothed, ops::Pass::kForwardBackward}, std::pair{capped, ops::Pass::kForward}}) {
    auto wrong = gpu.CrossEntropy(other);
    ASSERT_TRUE(wrong.ok());
    const absl::Status s = (*trial)->Check(*wrong, pass);
    EXPECT_FALSE(s.ok()) << ops::Name(pass);
    EXPECT_NE(std::string(ToStd(s.message())).find("wrong results"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace kjit
