// Issue 18 (a hostile user's second round) through the real `kjit` and `kjit-tune`: a cache path
// that is not UTF-8, an entry copied onto another key, a dangling symlink as the cache, a bad
// KJIT_NVRTC_PATH or KJIT_TRACE_MAX_EVENTS, a shared directory as the cache, a read-only cache
// under kjit-tune, and a directory named like an entry. Each test gets a fresh KJIT_CACHE_DIR and
// "no GPU" (KJIT_LIBCUDA_PATH at a missing file), so they mean the same on a machine with a GPU.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "jit/disk_cache.h"
#include "tests/temp_dir.h"
#include "tests/test_support.h"

#ifndef KJIT_CLI_PATH
#error "KJIT_CLI_PATH must name the built kjit binary"
#endif
#ifndef KJIT_TUNE_PATH
#error "KJIT_TUNE_PATH must name the built kjit-tune binary"
#endif

namespace kjit::tools {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::CliResult;

using testing::Contains;

// The value after `name` on its own line of `kjit compile`'s text report ("  key ab12").
std::string Field(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first, value;
    if (words >> first && first == name && words >> value) return value;
  }
  return "";
}

// JSON from a tool's stdout, or a failure naming what it was.
json ParseOut(const CliResult& r) {
  json j = json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON\n" << r.Describe();
  return j;
}

// The finding `check` of `kjit doctor --json`'s report, or null.
json Finding(const json& doctor, const std::string& check) {
  for (const json& f : doctor.value("findings", json::array())) {
    if (f.value("check", "") == check) return f;
  }
  return nullptr;
}

// PrebuildInto's report: ok, and its four kernels in the cache, exactly when `stored`.
void ExpectPrebuilt(const json& report, bool stored) {
  EXPECT_EQ(report["ok"], stored);
  EXPECT_EQ(report["stored"], stored);
  ASSERT_EQ(report["kernels"].size(), 4u) << report;
  for (const json& k : report["kernels"]) {
    EXPECT_EQ(k["stored"], stored) << k;
    EXPECT_EQ(k["path"] != "", stored) << k;
  }
}

class CacheCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(KJIT_CLI_PATH)) << KJIT_CLI_PATH << " is not built";
    ASSERT_TRUE(fs::exists(KJIT_TUNE_PATH)) << KJIT_TUNE_PATH << " is not built";
    ASSERT_TRUE(tmp_.ok());
    root_ = tmp_.path();
    cache_ = root_ + "/cache";
    env_["KJIT_CACHE_DIR"] = cache_;
    env_["KJIT_CACHE_MAX_BYTES"] = "";
    env_["KJIT_LIBCUDA_PATH"] = root_ + "/no-libcuda.so";  // "no GPU", even on a GPU machine
    env_["KJIT_TUNING_DB"] = root_ + "/tuning.json";
  }
  CliResult Kjit(const std::vector<std::string>& args) {
    return testing::RunKjit(args, env_, root_);
  }
  // `kjit-tune --compile-only --json` of a small model's four kernels for sm_90, into `cache`.
  CliResult PrebuildInto(const std::string& cache) {
    env_["KJIT_CACHE_DIR"] = cache;
    return testing::RunProgram(
        KJIT_TUNE_PATH, {"--model", "llama-3.2-1b", "--arch", "sm_90", "--compile-only", "--json"},
        env_, root_);
  }
  CliResult CompileRmsNorm(int hidden) {
    return Kjit(
        {"compile", "--op", "rms_norm", "--hidden", std::to_string(hidden), "--arch", "sm_90"});
  }
  // Makes `dir` the cache and compiles RMSNorm (hidden 512) into it: the entry's key.
  std::string CompileRmsNormInto(const std::string& dir) {
    cache_ = dir;
    env_["KJIT_CACHE_DIR"] = cache_;
    const CliResult compiled = CompileRmsNorm(512);
    EXPECT_EQ(compiled.exit_code, 0) << compiled.Describe();
    return Field(compiled.out, "key");
  }

  testing::TempDir tmp_{"kjit_cache_cli_test"};
  std::string root_, cache_;
  std::map<std::string, std::string> env_;
};

// Defect 2: every `--json` of `kjit cache` aborted (uncaught nlohmann type_error, exit 134) when
// the cache path was not UTF-8. The byte is written as U+FFFD.
TEST_F(CacheCliTest, CacheJsonWithANonUtf8PathIsValidJson) {
  const std::string key = CompileRmsNormInto(root_ + "/caf\xe9");
  const std::string shown = root_ + "/caf\xef\xbf\xbd";
  for (const char* action : {"ls", "verify", "prune"}) {
    SCOPED_TRACE(action);
    const CliResult r = Kjit({"cache", action, "--json"});
    ASSERT_EQ(r.exit_code, 0) << r.Describe();
    const json j = ParseOut(r);
    EXPECT_EQ(j.value("dir", ""), shown);
    if (std::string(action) == "prune") {
      EXPECT_EQ(j.value("removed", -1), 0);
    } else {
      ASSERT_EQ(j["entries"].size(), 1u) << j;
      EXPECT_EQ(j["entries"][0]["key"], key);
      EXPECT_EQ(j["entries"][0]["valid"], true);
    }
  }
}

// Issue 45, defect 11: an entry's parameters (a crafted entry, validly checksummed) and the
// cache's path reached the terminal raw from `kjit cache ls`, `verify` and `kjit doctor`.
TEST_F(CacheCliTest, LsVerifyAndDoctorEscapeWhatTheCacheHolds) {
  const std::string key = CompileRmsNormInto(root_ + "/cache\x1b]0;title\x07");
  absl::StatusOr<jit::DiskCache> cache = jit::DiskCache::Open({.dir = cache_});
  ASSERT_TRUE(cache.ok()) << cache.status();
  std::optional<jit::Binary> entry = cache->Lookup(key);
  ASSERT_TRUE(entry.has_value()) << key;
  entry->params["hidden"] = "512\x1b[2J\x1b[31m";
  ASSERT_TRUE(cache->Remove(key).ok());
  ASSERT_TRUE(cache->Store(key, *entry).ok());
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"cache", "ls"}, {"cache", "verify"}, {"doctor"}}) {
    const CliResult r = Kjit(args);
    EXPECT_FALSE(Contains(r.all(), "\x1b")) << args[0] << ": " << r.Describe();
    EXPECT_FALSE(Contains(r.all(), "\x07")) << args[0] << ": " << r.Describe();
    EXPECT_TRUE(Contains(r.all(), "cache\\x1b]0;title\\x07")) << args[0] << ": " << r.Describe();
  }
  EXPECT_TRUE(Contains(Kjit({"cache", "ls"}).out, "hidden=512\\x1b[2J\\x1b[31m"));
  // The entry's path in `kjit compile`'s report, and a failure naming the directory.
  const CliResult compiled = CompileRmsNorm(1024);
  EXPECT_EQ(compiled.exit_code, 0) << compiled.Describe();
  env_["KJIT_CACHE_DIR"] = root_ + "/missing\x1b[2J";
  const CliResult missing = Kjit({"cache", "ls"});
  EXPECT_EQ(missing.exit_code, 1) << missing.Describe();
  for (const CliResult& r : {compiled, missing}) {
    EXPECT_FALSE(Contains(r.all(), "\x1b")) << r.Describe();
    EXPECT_TRUE(Contains(r.all(), "\\x1b")) << r.Describe();
  }
}

// Defect 2: every kjit-tune worker aborted writing its answer ("crashed: signal 6", 0 of 3
// kernels ready) when the cache path was not UTF-8.
TEST_F(CacheCliTest, KjitTuneWithANonUtf8CachePathBuildsEveryKernel) {
  cache_ = root_ + "/caf\xe9";
  const CliResult r = PrebuildInto(cache_);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "4 of 4 kernels ready")) << r.err;
  EXPECT_FALSE(Contains(r.err, "crashed")) << r.err;
  const json report = ParseOut(r);
  ExpectPrebuilt(report, true);
  for (const json& k : report["kernels"]) {
    const std::string path = k["path"];
    EXPECT_TRUE(path.starts_with(root_ + "/caf\xef\xbf\xbd/")) << path;
    EXPECT_TRUE(fs::is_regular_file(cache_ + "/" + k["key"].get<std::string>() + ".kjit")) << k;
  }
}

// Defect 3: the hidden=512 entry copied over the hidden=1024 one was served as "hidden=512 ...
// from disk cache" for --hidden 1024, and verify called it valid.
TEST_F(CacheCliTest, AnEntryCopiedOverAnotherKeyIsCorruptAndRecompiled) {
  const CliResult small = CompileRmsNorm(512), large = CompileRmsNorm(1024);
  ASSERT_EQ(small.exit_code, 0) << small.Describe();
  ASSERT_EQ(large.exit_code, 0) << large.Describe();
  const std::string k512 = Field(small.out, "key"), k1024 = Field(large.out, "key");
  ASSERT_EQ(k512.size(), 32u);
  ASSERT_NE(k512, k1024);
  fs::copy_file(cache_ + "/" + k512 + ".kjit", cache_ + "/" + k1024 + ".kjit",
                fs::copy_options::overwrite_existing);

  const CliResult verify = Kjit({"cache", "verify"});
  EXPECT_EQ(verify.exit_code, 1) << verify.Describe();
  EXPECT_TRUE(Contains(verify.out, k1024 + " ")) << verify.out;
  EXPECT_TRUE(Contains(verify.out, "INVALID: corrupt cache entry: it was written for key '" + k512 +
                                       "', not " + k1024))
      << verify.out;
  EXPECT_TRUE(Contains(verify.out, "2 entries, ")) << verify.out;
  EXPECT_TRUE(Contains(verify.out, " 1 invalid")) << verify.out;

  const CliResult again = CompileRmsNorm(1024);
  ASSERT_EQ(again.exit_code, 0) << again.Describe();
  EXPECT_TRUE(Contains(again.out, "hidden=1024")) << again.out;
  EXPECT_FALSE(Contains(again.out, "hidden=512")) << again.out;
  EXPECT_EQ(Field(again.out, "key"), k1024);
  EXPECT_EQ(Field(again.out, "from"), "compiled") << "another key's entry was loaded";

  const CliResult clean = Kjit({"cache", "verify"});
  EXPECT_EQ(clean.exit_code, 0) << clean.Describe();
  EXPECT_TRUE(Contains(clean.out, "2 entries, ")) << clean.out;
  EXPECT_TRUE(Contains(clean.out, " 0 invalid")) << clean.out;
}

// Defect 5: doctor said "does not exist yet; kjit creates it" and compile "cannot stat L: No such
// file or directory". Both name the dangling link now.
TEST_F(CacheCliTest, ADanglingSymlinkAsTheCacheIsNamedByDoctorAndCompileAlike) {
  const std::string target = root_ + "/gone";
  ASSERT_EQ(::symlink(target.c_str(), cache_.c_str()), 0);
  const std::string said =
      fmt::format("{} is a symlink to '{}', which does not exist", cache_, target);

  const CliResult doctor = Kjit({"doctor", "--no-launch", "--json"});
  EXPECT_EQ(doctor.exit_code, 1) << doctor.Describe();
  const json dir = Finding(ParseOut(doctor), "cache.dir");
  ASSERT_TRUE(dir.is_object()) << doctor.out;
  EXPECT_EQ(dir["status"], "FAIL") << dir;
  EXPECT_EQ(dir["message"],
            fmt::format("{} (from KJIT_CACHE_DIR) cannot be used: {}", cache_, said))
      << dir;
  EXPECT_TRUE(Contains(dir["fix"], "remove the symlink")) << dir;

  const CliResult compile = CompileRmsNorm(512);
  EXPECT_EQ(compile.exit_code, 1) << compile.Describe();
  EXPECT_TRUE(Contains(compile.err, "kjit: disk cache: " + said)) << compile.err;
  EXPECT_FALSE(Contains(compile.err, "cannot stat")) << compile.err;
  EXPECT_FALSE(fs::exists(target)) << "kjit created the link's target";
}

// Defect 9: a KJIT_NVRTC_PATH that does not load was skipped silently for the default NVRTC, and
// doctor said NVRTC was fine.
TEST_F(CacheCliTest, AnNvrtcPathThatDoesNotLoadIsAnErrorNamingTheVariable) {
  const std::string text = root_ + "/libnvrtc-text.so";
  std::ofstream(text) << "not a library\n";
  const std::string dir = root_ + "/libnvrtc-dir.so";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  const std::vector<std::pair<std::string, std::string>> cases = {
      {root_ + "/missing/libnvrtc.so.13", "No such file or directory"},
      {text, "file too short"},
      {"/dev/zero", "invalid ELF header"},
      {dir, "Is a directory"},
  };
  for (const auto& [path, why] : cases) {
    SCOPED_TRACE(path);
    env_["KJIT_NVRTC_PATH"] = path;
    const CliResult compile = CompileRmsNorm(512);
    EXPECT_EQ(compile.exit_code, 1) << compile.Describe();
    EXPECT_TRUE(Contains(compile.err, "KJIT_NVRTC_PATH=" + path + " cannot be used as NVRTC: "))
        << compile.err;
    EXPECT_TRUE(Contains(compile.err, why)) << compile.err;
    EXPECT_TRUE(Contains(compile.err,
                         "fix: point KJIT_NVRTC_PATH at the libnvrtc.so of a CUDA "
                         "toolkit"))
        << compile.err;
    EXPECT_FALSE(Contains(compile.out, "compiled")) << compile.out;

    const CliResult doctor = Kjit({"doctor", "--no-launch", "--json"});
    EXPECT_EQ(doctor.exit_code, 1) << doctor.Describe();
    const json nvrtc = Finding(ParseOut(doctor), "nvrtc");
    ASSERT_TRUE(nvrtc.is_object()) << doctor.out;
    EXPECT_EQ(nvrtc["status"], "FAIL") << nvrtc;
    EXPECT_TRUE(Contains(nvrtc["message"], "KJIT_NVRTC_PATH=" + path)) << nvrtc;
    EXPECT_TRUE(Contains(nvrtc["fix"], "Point KJIT_NVRTC_PATH (now '" + path + "')")) << nvrtc;
  }
}

// Defect 10: KJIT_TRACE_MAX_EVENTS=-1 was taken (strtoull) as 18446744073709551615.
TEST_F(CacheCliTest, TraceMaxEventsTakesOnlyAPositiveWholeNumber) {
  ASSERT_EQ(CompileRmsNorm(512).exit_code, 0);  // later runs are cache hits
  const std::map<std::string, size_t> cases = {
      {"-1", 100000},
      {"0", 100000},
      {"+5", 100000},
      {" 5", 100000},
      {"5x", 100000},
      {"x", 100000},
      {"18446744073709551616", 100000},
      {"7", 7},
  };
  for (const auto& [value, kept] : cases) {
    SCOPED_TRACE("KJIT_TRACE_MAX_EVENTS='" + value + "'");
    const std::string trace = root_ + "/trace.json";
    env_["KJIT_TRACE"] = trace;
    env_["KJIT_TRACE_MAX_EVENTS"] = value;
    const CliResult r = CompileRmsNorm(512);
    ASSERT_EQ(r.exit_code, 0) << r.Describe();
    const std::string warning = "kjit: warning: KJIT_TRACE_MAX_EVENTS=" + value +
                                " is not a positive integer; using 100000";
    EXPECT_EQ(Contains(r.err, warning), kept == 100000) << r.err;
    const json doc = json::parse(testing::ReadFile(trace), nullptr, false);
    ASSERT_TRUE(doc.is_object());
    EXPECT_EQ(doc["otherData"]["max_events"], kept);
  }
}

// Defect 11: KJIT_CACHE_DIR=/tmp was answered with "chmod 700 '/tmp'". A shared (sticky)
// directory gets a private one instead, from kjit and doctor alike.
TEST_F(CacheCliTest, ASharedCacheDirectoryIsNeverToldToChmod) {
  const std::string shared = root_ + "/shared";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  std::vector<std::string> dirs = {shared};
  struct stat st {};
  if (::stat("/tmp", &st) == 0 && (st.st_mode & S_ISVTX) != 0) dirs.push_back("/tmp");
  for (const std::string& dir : dirs) {
    SCOPED_TRACE(dir);
    env_["KJIT_CACHE_DIR"] = dir;
    const CliResult compile = CompileRmsNorm(512);
    EXPECT_EQ(compile.exit_code, 1) << compile.Describe();
    EXPECT_TRUE(Contains(compile.err, "export KJIT_CACHE_DIR=$HOME/.cache/kjit")) << compile.err;
    EXPECT_TRUE(Contains(compile.err, "'" + dir +
                                          "' is a sticky directory like /tmp, shared by "
                                          "every user: do not chmod or chown it"))
        << compile.err;
    EXPECT_FALSE(Contains(compile.err, "chmod 700")) << compile.err;

    const CliResult doctor = Kjit({"doctor", "--no-launch", "--json"});
    const json p = Finding(ParseOut(doctor), "cache.permissions");
    ASSERT_TRUE(p.is_object()) << doctor.out;
    EXPECT_EQ(p["status"], "FAIL");
    EXPECT_TRUE(Contains(p["fix"], "export KJIT_CACHE_DIR=$HOME/.cache/kjit")) << p;
    EXPECT_FALSE(Contains(p["fix"], "chmod 700")) << p;
  }
}

// Defect 13: with a read-only cache, `kjit-tune --compile-only` said "3 of 3 kernels ready" and
// exited 0 with "path": "", though nothing was stored. /proc/self/fdinfo is a directory of the
// process's own that refuses new files even to root: a read-only cache without privileges.
TEST_F(CacheCliTest, KjitTuneIntoAReadOnlyCacheSaysNothingWasStoredAndFails) {
  const CliResult r = PrebuildInto("/proc/self/fdinfo");
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "nothing was stored in the kernel cache /proc/self/fdinfo")) << r.err;
  EXPECT_TRUE(Contains(r.err, "FAILED")) << r.err;
  const json report = ParseOut(r);
  ExpectPrebuilt(report, false);
  bool said = false;
  for (const json& f : report["failures"]) {
    if (f.value("phase", "") != "store") continue;
    said = true;
    EXPECT_TRUE(Contains(f["error"],
                         "nothing was stored in the kernel cache /proc/self/fdinfo: "
                         "compiled but kept in memory only"))
        << f;
    EXPECT_TRUE(Contains(f["error"], "is not writable")) << f;
  }
  EXPECT_TRUE(said) << report["failures"];
}

// Issue 34 (11): `kjit compile` into a cache it cannot write (a full filesystem, a read-only cache)
// warned, reported "path": "" and exited 0, while kjit-tune exits 1 in the same state.
TEST_F(CacheCliTest, KjitCompileIntoAReadOnlyCacheFails) {
  env_["KJIT_CACHE_DIR"] = "/proc/self/fdinfo";
  const CliResult r =
      Kjit({"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_90,sm_100", "--json"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  for (const char* target : {"sm_90", "sm_100"}) {
    EXPECT_TRUE(Contains(r.err, std::string("kjit compile: ") + target +
                                    ": compiled but not stored in the kernel cache"))
        << r.err;
  }
  const json report = ParseOut(r);
  ASSERT_EQ(report.size(), 2u) << report;
  for (const json& k : report) {
    EXPECT_EQ(k["origin"], "compiled") << k;
    EXPECT_EQ(k["path"], "") << k;
    EXPECT_EQ(k["stored"], false) << k;
  }
  env_["KJIT_CACHE_DIR"] = cache_;
  const CliResult stored = CompileRmsNorm(64);
  EXPECT_EQ(stored.exit_code, 0) << stored.Describe();
  EXPECT_FALSE(Contains(stored.err, "not stored")) << stored.err;
}

// Issue 34 ("Also"): `kjit cache ls` and `verify` created a mistyped cache directory and reported
// "0 entries" in it.
TEST_F(CacheCliTest, ACacheDirectoryThatDoesNotExistIsNotMade) {
  const std::string mistyped = root_ + "/cahce";
  env_["KJIT_CACHE_DIR"] = mistyped;
  for (const char* action : {"ls", "verify", "clear", "prune"}) {
    const CliResult r = Kjit({"cache", action});
    EXPECT_EQ(r.exit_code, 1) << action << "\n" << r.Describe();
    EXPECT_EQ(r.err, fmt::format("kjit: cache {}: {} does not exist, so nothing is cached there "
                                 "(the cache is $KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else "
                                 "~/.cache/kjit)\n",
                                 action, mistyped))
        << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
  }
  EXPECT_FALSE(fs::exists(mistyped));
}

// Defect 14: a directory named like an entry made `--fix-cache` fail (advising `rm` on a
// directory), stayed after `prune`, and made `verify` exit 1 forever.
TEST_F(CacheCliTest, ADirectoryNamedLikeAnEntryIsRemovedByPruneAndFixCache) {
  ASSERT_EQ(CompileRmsNorm(512).exit_code, 0);
  const std::string outside = root_ + "/outside";
  ASSERT_EQ(::mkdir(outside.c_str(), 0700), 0);
  std::ofstream(outside + "/keep") << "mine";
  const std::string squatter = cache_ + "/" + std::string(32, 'b') + ".kjit";
  const std::string other = cache_ + "/not-an-entry.kjit";
  auto plant = [&](const std::string& dir) {
    fs::create_directories(dir + "/sub");
    std::ofstream(dir + "/sub/file") << "x";
    fs::create_directory_symlink(outside, dir + "/sub/link");
  };
  plant(squatter);
  plant(other);

  const CliResult before = Kjit({"cache", "verify"});
  EXPECT_EQ(before.exit_code, 1) << before.Describe();
  EXPECT_TRUE(Contains(before.out, "INVALID: a directory, not an entry file")) << before.out;

  const CliResult prune = Kjit({"cache", "prune"});
  EXPECT_EQ(prune.exit_code, 0) << prune.Describe();
  EXPECT_TRUE(Contains(prune.out, ": removed 1 file(s)")) << prune.out;
  EXPECT_FALSE(fs::exists(squatter));
  const CliResult after = Kjit({"cache", "verify"});
  EXPECT_EQ(after.exit_code, 0) << after.Describe();
  EXPECT_TRUE(Contains(after.out, "1 entries")) << after.out;

  plant(squatter);
  const CliResult doctor = Kjit({"doctor", "--no-launch", "--fix-cache", "--json"});
  const json fix = Finding(ParseOut(doctor), "cache.fix");
  ASSERT_TRUE(fix.is_object()) << doctor.out;
  EXPECT_EQ(fix["status"], "OK") << fix;
  EXPECT_TRUE(Contains(fix["message"], "removed 1 entries (0 stale, 1 corrupt)")) << fix;
  EXPECT_FALSE(fs::exists(squatter));
  EXPECT_EQ(Kjit({"cache", "verify"}).exit_code, 0);

  EXPECT_TRUE(fs::exists(other + "/sub/file")) << "a name that is not an entry's is left alone";
  EXPECT_EQ(testing::ReadFile(outside + "/keep"), "mine") << "a link inside was followed";
}

}  // namespace
}  // namespace kjit::tools
