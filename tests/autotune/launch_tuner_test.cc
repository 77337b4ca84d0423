// KJIT_AUTOTUNE's tuner: a runtime reaches it through kjit::DefaultTuner() (kjit/runtime.h), a
// program that links kjit starts with the child-process tuner (autotune/launch_tuner.h), and that
// tuner runs kjit-tune with the request's flags and reports what goes wrong. No GPU: the tests
// drive a runtime's state directly, as a launch at an untuned bucket would.
#include "autotune/launch_tuner.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "jit/status_helpers.h"
#include "kjit/runtime.h"
#include "runtime/runtime_state.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit {
namespace {

using ::kjit::testing::Contains;

// Records each request and answers with `result`.
class FakeTuner : public Tuner {
 public:
  explicit FakeTuner(absl::Status result = absl::OkStatus()) : result_(std::move(result)) {}
  absl::Status Tune(const TuneRequest& request) override {
    requests.push_back(request);
    return result_;
  }
  std::vector<TuneRequest> requests;

 private:
  absl::Status result_;
};

class LaunchTunerTest : public ::testing::Test {
 protected:
  LaunchTunerTest() : saved_(DefaultTuner()) {
    state_.tuning_path = tmp_.path() + "/tuning.json";
    state_.device.ordinal = 2;
    state_.warnings = [this](std::string_view m) { warnings_.emplace_back(m); };
  }
  ~LaunchTunerTest() override { SetDefaultTuner(saved_); }

  // A script standing in for kjit-tune: writes its arguments, one a line, to args.txt and exits
  // with `exit_code`.
  std::string FakeKjitTune(int exit_code, const std::string& before_exit = "") {
    const std::string path = tmp_.path() + "/kjit-tune";
    std::ofstream(path) << "#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done > " << tmp_.path()
                        << "/args.txt\n"
                        << before_exit << "exit " << exit_code << "\n";
    ::chmod(path.c_str(), 0755);
    return path;
  }

  kjit::testing::TempDir tmp_{"kjit_launch_tuner_test"};
  std::shared_ptr<Tuner> saved_;
  internal::RuntimeState state_;
  std::vector<std::string> warnings_;
};

TEST_F(LaunchTunerTest, ProgramsThatLinkKjitStartWithTheChildProcessTuner) {
  EXPECT_EQ(kjit_launch_tuner_installed, 1);
  EXPECT_NE(dynamic_cast<autotune::ChildProcessTuner*>(DefaultTuner().get()), nullptr);
}

TEST_F(LaunchTunerTest, TheInstalledTunerReceivesTheRequest) {
  auto fake = std::make_shared<FakeTuner>();
  SetDefaultTuner(fake);
  state_.TuneNow(R"({"op": "rms_norm"})", 300);
  ASSERT_EQ(fake->requests.size(), 1u);
  const TuneRequest& r = fake->requests[0];
  EXPECT_EQ(r.spec_json, R"({"op": "rms_norm"})");
  EXPECT_EQ(r.rows, 300);
  EXPECT_EQ(r.tuning_db, state_.tuning_path);
  EXPECT_EQ(r.device, 2);
  ASSERT_TRUE(r.warnings);
  r.warnings("from the tuner");
  EXPECT_EQ(warnings_, std::vector<std::string>{"from the tuner"});
}

TEST_F(LaunchTunerTest, ATunerErrorIsAWarningAndTheLaunchGoesOnUntuned) {
  SetDefaultTuner(std::make_shared<FakeTuner>(absl::InternalError("the tuner fell over")));
  state_.TuneNow("{}", 64);
  EXPECT_EQ(warnings_, std::vector<std::string>{"the tuner fell over; launching untuned"});
  EXPECT_EQ(state_.Tuning(), nullptr);
}

TEST_F(LaunchTunerTest, WithoutATunerTheRuntimeWarnsOnce) {
  SetDefaultTuner(nullptr);
  state_.TuneNow("{}", 64);
  state_.TuneNow("{}", 4096);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_TRUE(Contains(warnings_[0], "no tuner is installed")) << warnings_[0];
  EXPECT_TRUE(Contains(warnings_[0], "launching untuned")) << warnings_[0];
}

TEST_F(LaunchTunerTest, ChildProcessTunerRunsKjitTuneWithTheRequestsFlags) {
  const std::string bin = FakeKjitTune(0);
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", bin.c_str());
  autotune::ChildProcessTuner tuner;
  const absl::Status s = tuner.Tune({.spec_json = R"({"op": "cross_entropy"})",
                                     .rows = 300,
                                     .tuning_db = "/db/tuning.json",
                                     .device = 1,
                                     .warnings = state_.warnings});
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(
      kjit::testing::ReadFile(tmp_.path() + "/args.txt"),
      "--spec\n{\"op\": \"cross_entropy\"}\n--tokens\n300\n--db\n/db/tuning.json\n--device\n1\n");
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_TRUE(Contains(warnings_[0], "at 300 rows with " + bin)) << warnings_[0];
}

TEST_F(LaunchTunerTest, ChildProcessTunerReportsANonZeroExit) {
  const std::string bin = FakeKjitTune(3);
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", bin.c_str());
  const absl::Status s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(ToStd(s.message()), bin + " exited with status 3");
}

// Issue 45, defect 7: several threads launching untuned ops tuned at once on one GPU, each
// disturbing the others' timings; one device's tunings now run one at a time.
class OverlapCountingTuner : public Tuner {
 public:
  absl::Status Tune(const TuneRequest&) override {
    const int now = ++running_;
    int seen = most.load();
    while (now > seen && !most.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    --running_;
    return absl::OkStatus();
  }
  std::atomic<int> most{0};

 private:
  std::atomic<int> running_{0};
};

TEST_F(LaunchTunerTest, OneDevicesTuningsRunOneAtATime) {
  auto tuner = std::make_shared<OverlapCountingTuner>();
  SetDefaultTuner(tuner);
  std::vector<std::unique_ptr<internal::RuntimeState>> runtimes;
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    internal::RuntimeState* rt =
        runtimes.emplace_back(std::make_unique<internal::RuntimeState>()).get();
    rt->tuning_path = state_.tuning_path;
    rt->device.ordinal = 2;
    rt->warnings = [](std::string_view) {};
    threads.emplace_back([rt, i] { rt->TuneNow("{}", 64 << i); });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(tuner->most.load(), 1);
}

// Issue 45, defect 7: a kjit-tune that never returns held the launch for ever; it is stopped
// after KJIT_AUTOTUNE_TIMEOUT seconds, and the launch goes on untuned with a warning.
TEST_F(LaunchTunerTest, ChildProcessTunerStopsAKjitTuneThatNeverReturns) {
  const std::string bin = FakeKjitTune(0, "exec sleep 600\n");
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", bin.c_str());
  kjit::testing::ScopedEnv timeout("KJIT_AUTOTUNE_TIMEOUT", "1");
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_EQ(ToStd(s.message()),
            bin + " did not finish within 1 s (KJIT_AUTOTUNE_TIMEOUT); it was stopped");
}

// Alive: a process that exists and is not a zombie (a killed orphan may wait a while for its
// reaper).
bool Alive(pid_t pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] != 'Z';
}

// Its workers go with it: a kjit-tune stopped at the timeout took only itself down, and the child
// it had started (a worker holding the GPU) lived on.
TEST_F(LaunchTunerTest, ChildProcessTunerStopsTheChildrenOfAKjitTuneThatNeverReturns) {
  const std::string pid_file = tmp_.path() + "/worker.pid";
  const std::string bin =
      FakeKjitTune(0, fmt::format("sleep 600 &\necho $! > {}\nwait\n", pid_file));
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", bin.c_str());
  kjit::testing::ScopedEnv timeout("KJIT_AUTOTUNE_TIMEOUT", "1");
  const absl::Status s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  pid_t worker = 0;
  ASSERT_TRUE(std::ifstream(pid_file) >> worker) << "the fake kjit-tune did not start its worker";
  ASSERT_GT(worker, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (Alive(worker) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const bool survived = Alive(worker);
  if (survived) ::kill(worker, SIGKILL);  // leave nothing behind
  EXPECT_FALSE(survived) << "kjit-tune's child " << worker << " outlived the timeout";
}

TEST_F(LaunchTunerTest, ChildProcessTunerRefusesABadTimeout) {
  const std::string bin = FakeKjitTune(0);
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", bin.c_str());
  for (const char* bad : {"0", "-3", "soon", "1e99"}) {
    kjit::testing::ScopedEnv timeout("KJIT_AUTOTUNE_TIMEOUT", bad);
    const absl::Status s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_EQ(ToStd(s.message()), fmt::format("KJIT_AUTOTUNE_TIMEOUT: \"{}\" is not a number of "
                                              "seconds from 1 to 86400",
                                              bad));
  }
}

TEST_F(LaunchTunerTest, ChildProcessTunerReportsAMissingBinary) {
  // Nothing to find: no KJIT_TUNE_BIN and a PATH without kjit-tune.
  kjit::testing::ScopedEnv tune_bin("KJIT_TUNE_BIN", nullptr);
  kjit::testing::ScopedEnv path("PATH", tmp_.path().c_str());
  absl::Status s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_TRUE(
      Contains(std::string(ToStd(s.message())), "kjit-tune is not on PATH (or in KJIT_TUNE_BIN)"))
      << s;
  EXPECT_TRUE(warnings_.empty());

  // KJIT_TUNE_BIN naming a file that is not there.
  const std::string missing = tmp_.path() + "/no-such-kjit-tune";
  kjit::testing::ScopedEnv missing_bin("KJIT_TUNE_BIN", missing.c_str());
  s = autotune::ChildProcessTuner().Tune({.warnings = state_.warnings});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(Contains(std::string(ToStd(s.message())), missing + " could not start")) << s;
}

}  // namespace
}  // namespace kjit
