// RunInWorkers with /bin/sh workers that follow (or break) the protocol: answers come back in task
// order, a crash or a hang fails only the task in progress, the rest of its batch goes to a new
// worker, and a worker that cannot start fails its tasks with the reason.
#include "autotune/worker_pool.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "jit/file_io.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit::autotune {
namespace {

std::vector<std::string> Sh(const std::string& script) { return {"/bin/sh", "-c", script}; }

TEST(WorkerPool, AnswersEveryTaskInOrder) {
  // Answers each position of its batch with the position itself.
  const std::string script =
      "read req; n=$(echo \"$req\" | tr ',' '\\n' | wc -l); i=0; "
      "while [ $i -lt $n ]; do echo \"{\\\"begin\\\":$i}\"; "
      "echo \"{\\\"end\\\":$i,\\\"result\\\":{\\\"pos\\\":$i}}\"; i=$((i+1)); done";
  int done = 0;
  const auto out = RunInWorkers(
      {"1", "2", "3", "4", "5"},
      {.command = Sh(script), .jobs = 2, .batch = 2, .on_done = [&](size_t, const TaskOutcome&) {
         ++done;
       }});
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(done, 5);
  // Batches {0,1}, {2,3}, {4}: positions 0, 1, 0, 1, 0.
  const std::vector<std::string> expected = {R"({"pos":0})", R"({"pos":1})", R"({"pos":0})",
                                             R"({"pos":1})", R"({"pos":0})"};
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_TRUE(out[i].answered) << i << ": " << out[i].failure;
    EXPECT_EQ(out[i].result, expected[i]) << i;
  }
}

TEST(WorkerPool, ACrashFailsTheTaskInProgressAndTheRestRunElsewhere) {
  // Answers position 0, begins position 1 and dies by SIGSEGV.
  const std::string script =
      "echo '{\"begin\":0}'; echo '{\"end\":0,\"result\":\"fine\"}'; echo '{\"begin\":1}'; "
      "echo 'dying now' >&2; kill -SEGV $$";
  const auto out =
      RunInWorkers({"\"a\"", "\"b\"", "\"c\""}, {.command = Sh(script), .jobs = 1, .batch = 3});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].answered);
  EXPECT_EQ(out[0].result, "\"fine\"");
  EXPECT_FALSE(out[1].answered);
  EXPECT_NE(out[1].failure.find("crashed: signal 11"), std::string::npos) << out[1].failure;
  EXPECT_NE(out[1].log.find("dying now"), std::string::npos) << out[1].log;
  // Task c went to a second worker, whose position 0 it was.
  EXPECT_TRUE(out[2].answered) << out[2].failure;
  EXPECT_EQ(out[2].result, "\"fine\"");
}

TEST(WorkerPool, AWorkerThatQuitsBetweenTasksFailsNoneOfThem) {
  // As a GPU worker does after answering a task that broke its context: exit, status 3.
  const std::string script = "echo '{\"begin\":0}'; echo '{\"end\":0,\"result\":7}'; exit 3";
  const auto out = RunInWorkers({"1", "2", "3"}, {.command = Sh(script), .batch = 3});
  for (const TaskOutcome& o : out) {
    EXPECT_TRUE(o.answered) << o.failure;
    EXPECT_EQ(o.result, "7");
  }
}

TEST(WorkerPool, AHangIsKilledAfterTheTimeout) {
  const auto start = std::chrono::steady_clock::now();
  const auto out =
      RunInWorkers({"\"a\"", "\"b\""}, {.command = Sh("echo '{\"begin\":0}'; exec sleep 30"),
                                        .jobs = 2,
                                        .task_timeout = std::chrono::milliseconds(300)});
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  for (const TaskOutcome& o : out) {
    EXPECT_FALSE(o.answered);
    EXPECT_NE(o.failure.find("hung: no answer"), std::string::npos) << o.failure;
  }
}

TEST(WorkerPool, AWorkerThatExitsBeforeAnsweringFailsOneTaskAtATime) {
  // Every worker reads its request, prints it to stderr and exits 3 without beginning anything.
  const auto out =
      RunInWorkers({"\"x\"", "\"y\""}, {.command = Sh("cat >&2; exit 3"), .jobs = 1, .batch = 2});
  ASSERT_EQ(out.size(), 2u);
  for (const TaskOutcome& o : out) {
    EXPECT_FALSE(o.answered);
    EXPECT_EQ(o.failure, "worker exited with status 3 before answering");
  }
  // The first worker got both tasks; the second only the one left.
  EXPECT_NE(out[0].log.find(R"({"tasks":["x","y"]})"), std::string::npos) << out[0].log;
  EXPECT_NE(out[1].log.find(R"({"tasks":["y"]})"), std::string::npos) << out[1].log;
}

TEST(WorkerPool, AWorkerThatCannotStartFailsItsTasksWithTheReason) {
  const auto out = RunInWorkers({"1"}, {.command = {"/nonexistent/kjit-worker"}});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_FALSE(out[0].answered);
  EXPECT_NE(out[0].failure.find("/nonexistent/kjit-worker"), std::string::npos) << out[0].failure;
}

// Issue 18: each `kill -9` of kjit-tune left a kjit-workers-* directory in TMPDIR for good. The
// next pool removes those whose owner is gone, and nothing else.
TEST(WorkerPool, DirectoriesOfKilledPoolsAreRemovedByTheNextOne) {
  namespace fs = std::filesystem;
  testing::TempDir tmp("kjit_worker_pool_test");
  ASSERT_TRUE(tmp.ok());
  testing::ScopedEnv tmpdir("TMPDIR", tmp.path().c_str());
  auto pool_dirs = [&] {
    std::vector<std::string> names = testing::NamesWithPrefix(tmp.path(), "kjit-workers-");
    std::sort(names.begin(), names.end());
    return names;
  };

  // A pool killed by SIGKILL while its worker runs (the worker outlives it briefly).
  std::fflush(nullptr);
  const pid_t killed = ::fork();
  if (killed == 0) {
    RunInWorkers({"1"}, {.command = Sh("sleep 3")});
    ::_exit(0);
  }
  std::optional<std::string> left;
  for (int i = 0; i < 1000 && !left; ++i) {
    for (const std::string& name : pool_dirs()) {
      if (fs::exists(tmp.path() + "/" + name + "/request-0.json")) left = name;  // started
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(left.has_value()) << "the pool never made its directory";
  ::kill(killed, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(killed, &status, 0), killed);

  // A live pool's (its lock held here), a pool's of an older kjit without the lock file, young
  // and old, and a symlink with our prefix to a directory that is not ours to empty.
  const std::string live = tmp.path() + "/kjit-workers-live00";
  ASSERT_EQ(::mkdir(live.c_str(), 0700), 0);
  absl::StatusOr<jit::FileLock> held = jit::LockFile(live + "/owner.lock", std::chrono::seconds(0));
  ASSERT_TRUE(held.ok()) << held.status();
  const std::string young = tmp.path() + "/kjit-workers-young0";
  const std::string old = tmp.path() + "/kjit-workers-old000";
  for (const std::string& d : {young, old}) {
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
    std::ofstream(d + "/request-0.json") << "{}";
  }
  const timespec two_hours_ago[2] = {{::time(nullptr) - 7200, 0}, {::time(nullptr) - 7200, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, old.c_str(), two_hours_ago, 0), 0);
  const std::string elsewhere = tmp.path() + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0700), 0);
  std::ofstream(elsewhere + "/keep") << "x";
  ASSERT_EQ(::symlink(elsewhere.c_str(), (tmp.path() + "/kjit-workers-link00").c_str()), 0);

  const auto out = RunInWorkers({"1"}, {.command = Sh("echo '{\"begin\":0}'; "
                                                      "echo '{\"end\":0,\"result\":1}'")});
  ASSERT_EQ(out.size(), 1u);
  EXPECT_TRUE(out[0].answered) << out[0].failure;
  EXPECT_EQ(pool_dirs(), (std::vector<std::string>{"kjit-workers-link00", "kjit-workers-live00",
                                                   "kjit-workers-young0"}))
      << "the killed pool's " << *left << " and the old one go; its own is removed at the end";
  EXPECT_TRUE(fs::exists(elsewhere + "/keep")) << "a symlink was followed";
}

}  // namespace
}  // namespace kjit::autotune
