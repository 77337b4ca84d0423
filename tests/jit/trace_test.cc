// The Chrome trace writer: a file Perfetto can open, written once, capped; and `kjit --trace`.
#include "jit/trace.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/temp_dir.h"
#include "tests/test_support.h"

namespace kjit::jit {
namespace {

namespace fs = std::filesystem;

// Reads a FIFO on a thread until its writers are gone. It holds a write end of its own meanwhile:
// so a writer opening the FIFO later finds a reader there, and the read waits for that writer
// instead of ending at once. Finish() lets go of that end and returns what was read.
class FifoReader {
 public:
  explicit FifoReader(const std::string& path)
      : read_fd_(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)),
        hold_fd_(::open(path.c_str(), O_WRONLY | O_CLOEXEC)) {
    if (read_fd_ >= 0) ::fcntl(read_fd_, F_SETFL, 0);  // blocking reads
    thread_ = std::thread([this] {
      char buf[1 << 16];
      for (;;) {
        const ssize_t n = ::read(read_fd_, buf, sizeof buf);
        if (n > 0) {
          data_.append(buf, static_cast<size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          return;
        }
      }
    });
  }
  ~FifoReader() { Finish(); }
  FifoReader(const FifoReader&) = delete;
  FifoReader& operator=(const FifoReader&) = delete;

  bool ok() const { return read_fd_ >= 0 && hold_fd_ >= 0; }
  std::string Finish() {
    if (hold_fd_ >= 0) ::close(std::exchange(hold_fd_, -1));
    if (thread_.joinable()) thread_.join();
    if (read_fd_ >= 0) ::close(std::exchange(read_fd_, -1));
    return data_;
  }

 private:
  int read_fd_, hold_fd_;
  std::string data_;
  std::thread thread_;
};

bool IsFifo(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0 && S_ISFIFO(st.st_mode);
}

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    dir_ = tmp_.path();
  }
  nlohmann::json Read(const std::string& path) {
    return nlohmann::json::parse(testing::ReadFile(path));
  }
  testing::TempDir tmp_{"kjit_trace_test"};
  std::string dir_;
};

TEST_F(TraceTest, WritesChromeTraceEvents) {
  const std::string path = dir_ + "/trace.json";
  Tracer t(path, /*launches=*/false, /*max_events=*/100);
  t.Complete("compile", "jit", 1000, 250, {{"target", "sm_90"}});
  t.Instant("cache miss", "jit", {{"key", "abc"}});
  ASSERT_TRUE(t.Flush().ok());
  const nlohmann::json doc = Read(path);
  ASSERT_EQ(doc["traceEvents"].size(), 2u);
  const auto& x = doc["traceEvents"][0];
  EXPECT_EQ(x["name"], "compile");
  EXPECT_EQ(x["cat"], "jit");
  EXPECT_EQ(x["ph"], "X");
  EXPECT_EQ(x["ts"], 1000);
  EXPECT_EQ(x["dur"], 250);
  EXPECT_EQ(x["pid"], static_cast<int>(::getpid()));
  EXPECT_EQ(x["args"]["target"], "sm_90");
  EXPECT_EQ(doc["traceEvents"][1]["ph"], "i");
  EXPECT_EQ(doc["otherData"]["dropped_events"], 0);
  EXPECT_EQ(testing::NamesWithPrefix(dir_, ""), std::vector<std::string>{"trace.json"})
      << "a temp file is left";
}

TEST_F(TraceTest, WrittenOnceLaterEventsAreDropped) {
  const std::string path = dir_ + "/trace.json";
  Tracer t(path, false, 100);
  t.Instant("first", "jit", {});
  ASSERT_TRUE(t.Flush().ok());
  const std::string written = testing::ReadFile(path);
  t.Instant("second", "jit", {});
  ASSERT_TRUE(t.Flush().ok());
  EXPECT_EQ(testing::ReadFile(path), written) << "a second flush must not write the file again";
}

TEST_F(TraceTest, CapsTheEventsAndCountsTheDropped) {
  const std::string path = dir_ + "/trace.json";
  Tracer t(path, false, /*max_events=*/3);
  for (int i = 0; i < 10; ++i) t.Instant("e" + std::to_string(i), "jit", {});
  ASSERT_TRUE(t.Flush().ok());
  const nlohmann::json doc = Read(path);
  EXPECT_EQ(doc["traceEvents"].size(), 3u);
  EXPECT_EQ(doc["traceEvents"][2]["name"], "e2");
  EXPECT_EQ(doc["otherData"]["dropped_events"], 7);
  EXPECT_EQ(doc["otherData"]["max_events"], 3);
}

// Issue 34, defect 6: processes sharing KJIT_TRACE (kjit-tune's workers, a job's ranks) each
// replaced the file, so one process's events survived. Now each adds its own to the kjit trace
// there: four processes writing at once, then a fifth, all land.
TEST_F(TraceTest, ProcessesSharingTheFileAllLandInIt) {
  const std::string path = dir_ + "/trace.json";
  auto write_events = [&](int process) {
    Tracer t(path, false, /*max_events=*/20);
    for (int i = 0; i < 25; ++i) t.Instant(fmt::format("p{} e{}", process, i), "jit", {});
    return t.Flush();
  };
  std::vector<pid_t> children;
  for (int process = 0; process < 4; ++process) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) ::_exit(write_events(process).ok() ? 0 : 1);
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  ASSERT_TRUE(write_events(4).ok());
  const nlohmann::json doc = Read(path);
  std::set<std::string> names;
  std::set<int> pids;
  for (const auto& e : doc["traceEvents"]) {
    names.insert(e["name"].get<std::string>());
    pids.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(names.size(), 5u * 20) << doc.dump();
  for (int process = 0; process < 5; ++process) {
    EXPECT_TRUE(names.count(fmt::format("p{} e19", process))) << process;
  }
  EXPECT_EQ(pids.size(), 5u);
  EXPECT_EQ(doc["otherData"]["dropped_events"], 5 * 5);
  EXPECT_EQ(testing::NamesWithPrefix(dir_, ""), std::vector<std::string>{"trace.json"})
      << "a temp or lock file is left";
}

// What is not a kjit trace (another program's file, or an empty one a writer left) is replaced.
TEST_F(TraceTest, AFileThatIsNotAKjitTraceIsReplaced) {
  const std::string path = dir_ + "/trace.json";
  for (const char* before : {"", "not json", "{\"traceEvents\": [{\"name\": \"theirs\"}]}"}) {
    {
      std::ofstream out(path);
      out << before;
    }
    Tracer t(path, false, 100);
    t.Instant("ours", "jit", {});
    ASSERT_TRUE(t.Flush().ok());
    const nlohmann::json doc = Read(path);
    ASSERT_EQ(doc["traceEvents"].size(), 1u) << before;
    EXPECT_EQ(doc["traceEvents"][0]["name"], "ours");
  }
}

TEST_F(TraceTest, OffRecordsNothingAndAnUnwritablePathIsAnError) {
  Tracer off("", false, 100);
  off.Instant("x", "jit", {});
  EXPECT_FALSE(off.enabled());
  EXPECT_TRUE(off.Flush().ok());

  Tracer bad(dir_ + "/missing-dir/trace.json", false, 100);
  bad.Instant("x", "jit", {});
  absl::Status s = bad.Flush();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(std::string(s.message()).find("missing-dir"), std::string::npos) << s;
  // Said as the trace it could not write, not as a lock file (the merge's lock is on the file).
  EXPECT_TRUE(std::string(s.message())
                  .starts_with("KJIT_TRACE: cannot write " + dir_ + "/missing-dir/trace.json: "))
      << s;
}

// Issue 18, defect 1: the trace was written to a temp file renamed over the path, which replaced a
// FIFO (or a device) named as the trace with a regular file, and its reader got nothing.
TEST_F(TraceTest, AFifoIsWrittenIntoNotReplaced) {
  const std::string fifo = dir_ + "/trace.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  FifoReader reader(fifo);
  ASSERT_TRUE(reader.ok()) << std::strerror(errno);
  // Far more than a pipe holds (64 KiB): the writer must wait for the reader, not fail or drop.
  Tracer t(fifo, false, /*max_events=*/100000);
  for (int i = 0; i < 3000; ++i) t.Instant("event " + std::to_string(i), "jit", {});
  const absl::Status s = t.Flush();
  const std::string got = reader.Finish();
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(IsFifo(fifo)) << "the FIFO was replaced";
  EXPECT_GT(got.size(), size_t{1} << 16);
  const nlohmann::json doc = nlohmann::json::parse(got, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object()) << "not JSON: " << got.substr(0, 200);
  ASSERT_EQ(doc["traceEvents"].size(), 3000u);
  EXPECT_EQ(doc["traceEvents"][2999]["name"], "event 2999");
  EXPECT_EQ(testing::NamesWithPrefix(dir_, ".tmp-"), std::vector<std::string>{});
}

TEST_F(TraceTest, AFifoWithNoReaderIsAnErrorNotAWait) {
  const std::string fifo = dir_ + "/trace.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  Tracer t(fifo, false, 100);
  t.Instant("x", "jit", {});
  const auto start = std::chrono::steady_clock::now();
  const absl::Status s = t.Flush();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(fifo), absl::string_view::npos) << s;
  EXPECT_NE(s.message().find("no reader"), absl::string_view::npos) << s;
  EXPECT_TRUE(IsFifo(fifo));
  EXPECT_EQ(testing::NamesWithPrefix(dir_, ".tmp-"), std::vector<std::string>{});
}

// SIGPIPE would end the process: the trace is written at exit, and a killed program loses its exit
// status over a trace.
TEST_F(TraceTest, AReaderThatQuitsEarlyCostsTheTraceNotTheProcess) {
  const std::string fifo = dir_ + "/trace.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  const int read_fd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(read_fd, 0) << std::strerror(errno);
  Tracer t(fifo, false, 100000);
  for (int i = 0; i < 3000; ++i) t.Instant("event " + std::to_string(i), "jit", {});
  // The reader goes away once the writer has filled the pipe and waits for room.
  std::thread quitter([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    int queued = 0;
    while (::ioctl(read_fd, FIONREAD, &queued) == 0 && queued < 4096 &&
           std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ::close(read_fd);
  });
  const absl::Status s = t.Flush();
  quitter.join();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(fifo), absl::string_view::npos) << s;
  EXPECT_TRUE(IsFifo(fifo));
}

// A character device, as `kjit --trace /dev/null` names one. Reached through a link in the test's
// directory: should the writer ever rename over the path again, the link is replaced, not (when
// the test runs as root) the machine's /dev/null.
TEST_F(TraceTest, ACharacterDeviceIsWrittenIntoNotReplaced) {
  if (::access("/dev/null", W_OK) != 0) GTEST_SKIP() << "/dev/null is not writable here";
  const std::string link = dir_ + "/null";
  ASSERT_EQ(::symlink("/dev/null", link.c_str()), 0) << std::strerror(errno);
  Tracer t(link, false, 100);
  t.Instant("x", "jit", {});
  const absl::Status s = t.Flush();
  EXPECT_TRUE(s.ok()) << s;
  struct stat st {};
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode)) << "the link to /dev/null was replaced";
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(testing::NamesWithPrefix(dir_, ""), std::vector<std::string>{"null"});
}

TEST_F(TraceTest, ADirectoryIsRefusedNotReplaced) {
  const std::string path = dir_ + "/trace.json";
  ASSERT_TRUE(fs::create_directory(path));
  Tracer t(path, false, 100);
  t.Instant("x", "jit", {});
  const absl::Status s = t.Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(path), absl::string_view::npos) << s;
  EXPECT_TRUE(fs::is_directory(path));
}

#ifdef KJIT_CLI_PATH
TEST_F(TraceTest, KjitTraceIntoAFifo) {
  const std::string fifo = dir_ + "/trace.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  FifoReader reader(fifo);
  ASSERT_TRUE(reader.ok()) << std::strerror(errno);
  testing::CliResult r = testing::RunKjit(
      {"--trace", fifo, "compile", "--op", "rms_norm", "--hidden", "512", "--arch", "sm_90"},
      {{"KJIT_CACHE_DIR", dir_ + "/cache"}, {"KJIT_CACHE_MAX_BYTES", ""}}, dir_);
  const std::string got = reader.Finish();
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.err.find("KJIT_TRACE"), std::string::npos) << r.err;
  EXPECT_TRUE(IsFifo(fifo)) << "kjit --trace replaced the FIFO";
  const nlohmann::json doc = nlohmann::json::parse(got, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(doc.is_object()) << "not JSON: " << got.substr(0, 200);
  EXPECT_FALSE(doc["traceEvents"].empty()) << got;
}

TEST_F(TraceTest, KjitTraceRecordsCompilesAndCacheHits) {
  const std::map<std::string, std::string> env = {{"KJIT_CACHE_DIR", dir_ + "/cache"},
                                                  {"KJIT_CACHE_MAX_BYTES", ""}};
  const std::vector<std::string> compile = {"compile", "--op",   "rms_norm", "--hidden",
                                            "512",     "--arch", "sm_90"};
  auto with_trace = [&](const std::string& path) {
    std::vector<std::string> args = {"--trace", path};
    args.insert(args.end(), compile.begin(), compile.end());
    return args;
  };
  testing::CliResult r = testing::RunKjit(with_trace(dir_ + "/first.json"), env, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::map<std::string, std::string> origin;
  const nlohmann::json first = Read(dir_ + "/first.json");
  for (const auto& e : first["traceEvents"]) {
    origin[e["name"].get<std::string>()] = e["args"].value("origin", "");
  }
  EXPECT_TRUE(origin.count("nvrtc rms_norm"));
  EXPECT_EQ(origin["build rms_norm"], "compiled");

  r = testing::RunKjit(with_trace(dir_ + "/second.json"), env, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const nlohmann::json second = Read(dir_ + "/second.json");
  ASSERT_EQ(second["traceEvents"].size(), 1u) << second.dump();
  EXPECT_EQ(second["traceEvents"][0]["args"]["origin"], "disk cache");

  // --trace starts its file afresh: a run into first.json again holds that run's events alone,
  // not the first run's as well (KJIT_TRACE alone adds to what a file holds).
  r = testing::RunKjit(with_trace(dir_ + "/first.json"), env, dir_);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const nlohmann::json again = Read(dir_ + "/first.json");
  ASSERT_EQ(again["traceEvents"].size(), 1u) << again.dump();
  EXPECT_EQ(again["traceEvents"][0]["args"]["origin"], "disk cache");
}
#endif

}  // namespace
}  // namespace kjit::jit
