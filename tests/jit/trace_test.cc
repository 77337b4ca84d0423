// The Chrome trace writer: a file Perfetto can open, written once, capped; and `kjit --trace`.
#include "jit/trace.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_support.h"
#include "tests/temp_dir.h"

namespace kjit::jit {
namespace {

namespace fs = std::filesystem;

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
  EXPECT_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
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
}

#ifdef KJIT_CLI_PATH
TEST_F(TraceTest, KjitTraceRecordsCompilesAndCacheHits) {
  const std::map<std::string, std::string> env = {{"KJIT_CACHE_DIR", dir_ + "/cache"},
                                                  {"KJIT_CACHE_MAX_BYTES", ""}};
  const std::vector<std::string> compile = {"compile", "--op", "rms_norm", "--hidden", "512",
                                            "--arch", "sm_90"};
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
}
#endif

}  // namespace
}  // namespace kjit::jit
