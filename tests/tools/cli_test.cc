// The `kjit` command line, run as a subprocess: exit codes, messages and JSON. Each test gets a
// fresh KJIT_CACHE_DIR. Tests that need "no GPU" point KJIT_LIBCUDA_PATH at a missing file, so they
// mean the same on a machine with a GPU.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/temp_dir.h"
#include "tests/test_support.h"

#ifndef KJIT_CLI_PATH
#error "KJIT_CLI_PATH must name the built kjit binary"
#endif

namespace kjit::tools {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::ReadFile;

using testing::Contains;

// The value printed after `name` on its own line of `kjit compile`'s text report ("  key ab12").
std::vector<std::string> Fields(const std::string& text, const std::string& name) {
  std::vector<std::string> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string first, value;
    if (words >> first && first == name && words >> value) out.push_back(value);
  }
  return out;
}

// The command line as one string, for failure messages.
std::string Joined(const std::vector<std::string>& args) {
  std::string line;
  for (const std::string& a : args) line += (line.empty() ? "" : " ") + ("'" + a + "'");
  return line;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(KJIT_CLI_PATH)) << KJIT_CLI_PATH << " is not built";
    ASSERT_TRUE(tmp_.ok());
    root_ = tmp_.path();
    cache_ = root_ + "/cache";
    env_["KJIT_CACHE_DIR"] = cache_;
    env_["KJIT_CACHE_MAX_BYTES"] = "";  // no eviction from the caller's environment
  }

  // Runs kjit with `args`; the environment is ours with env_ applied (an empty value unsets).
  CliResult Run(const std::vector<std::string>& args,
                testing::Stdout to = testing::Stdout::kCaptured) {
    return testing::RunKjit(args, env_, root_, to);
  }

  // Runs kjit with `args`, which must be a usage error whose message starts with `message`.
  void ExpectUsageError(const std::vector<std::string>& args, const std::string& message) {
    const CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << "kjit " << Joined(args) << "\n" << r.Describe();
    EXPECT_TRUE(r.err.starts_with(message))
        << "kjit " << Joined(args) << ": expected " << message << "\n"
        << r.Describe();
  }

  // Entry files (*.kjit) in the cache directory.
  std::vector<std::string> EntryFiles() const {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(cache_, ec)) {
      if (e.path().extension() == ".kjit") out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  testing::TempDir tmp_{"kjit_cli_test"};
  std::string root_;
  std::string cache_;
  std::map<std::string, std::string> env_;
};

const std::vector<std::string> kCompile4096 = {"compile", "--op", "rms_norm", "--hidden", "4096",
                                               "--dtype", "bf16", "--arch",   "sm_100"};

TEST_F(CliTest, VersionPrintsTheVersions) {
  env_["KJIT_LIBCUDA_PATH"] = root_ + "/no-libcuda.so";
  CliResult r = Run({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.all(), "kjit 0.1.0 (NVRTC 13.")) << r.Describe();
  EXPECT_TRUE(Contains(r.all(), "CUDA driver none (no CUDA driver")) << r.Describe();
}

TEST_F(CliTest, HelpListsTheSubcommands) {
  CliResult r = Run({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  for (const char* cmd : {"compile", "cache", "bench"}) {
    EXPECT_TRUE(Contains(r.out, cmd)) << cmd << "\n" << r.Describe();
  }
  CliResult sub = Run({"compile", "--help"});
  EXPECT_EQ(sub.exit_code, 0) << sub.Describe();
  for (const char* opt : {"--op", "--hidden", "--dtype", "--arch", "--json"}) {
    EXPECT_TRUE(Contains(sub.out, opt)) << opt << "\n" << sub.Describe();
  }
}

TEST_F(CliTest, CompileThenTheSecondCallHitsTheDiskCache) {
  CliResult first = Run(kCompile4096);
  ASSERT_EQ(first.exit_code, 0) << first.Describe();
  EXPECT_EQ(Fields(first.out, "from"), std::vector<std::string>{"compiled"}) << first.Describe();
  const std::vector<std::string> keys = Fields(first.out, "key");
  ASSERT_EQ(keys.size(), 1u) << first.Describe();
  EXPECT_EQ(keys[0].size(), 32u) << keys[0];
  EXPECT_TRUE(Contains(first.out, "sm_100")) << first.Describe();
  ASSERT_EQ(EntryFiles(), std::vector<std::string>{cache_ + "/" + keys[0] + ".kjit"});
  EXPECT_EQ(Fields(first.out, "path"), std::vector<std::string>{cache_ + "/" + keys[0] + ".kjit"});

  CliResult second = Run(kCompile4096);
  ASSERT_EQ(second.exit_code, 0) << second.Describe();
  EXPECT_TRUE(Contains(second.out, "disk cache")) << second.Describe();
  EXPECT_EQ(Fields(second.out, "key"), keys) << second.Describe();
  EXPECT_EQ(EntryFiles().size(), 1u);
}

TEST_F(CliTest, JsonReportHasOneEntryPerArch) {
  std::vector<std::string> args = {"compile", "--op", "rms_norm", "--hidden",     "4096",
                                   "--dtype", "bf16", "--arch",   "sm_90,sm_100", "--json"};
  CliResult r = Run(args);
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  nlohmann::json j;
  ASSERT_NO_THROW(j = nlohmann::json::parse(r.out)) << r.Describe();
  ASSERT_TRUE(j.is_array()) << j.dump(2);
  ASSERT_EQ(j.size(), 2u) << j.dump(2);
  const std::vector<std::string> targets = {"sm_90", "sm_100"};
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    for (const char* field : {"target", "key", "config", "origin", "path"}) {
      ASSERT_TRUE(e.contains(field)) << field << " missing in " << e.dump(2);
      EXPECT_TRUE(e[field].is_string()) << field << " in " << e.dump(2);
    }
    EXPECT_EQ(e["target"], targets[i]);
    EXPECT_EQ(e["origin"], "compiled");
    EXPECT_EQ(e["key"].get<std::string>().size(), 32u);
    EXPECT_TRUE(Contains(e["config"].get<std::string>(), "vec=")) << e.dump(2);
    EXPECT_EQ(e["path"], cache_ + "/" + e["key"].get<std::string>() + ".kjit");
    EXPECT_TRUE(fs::is_regular_file(e["path"].get<std::string>())) << e.dump(2);
  }
  EXPECT_NE(j[0]["key"], j[1]["key"]);

  CliResult again = Run(args);
  ASSERT_EQ(again.exit_code, 0) << again.Describe();
  nlohmann::json k = nlohmann::json::parse(again.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(k.is_discarded()) << again.Describe();
  ASSERT_EQ(k.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(k[i]["origin"], "disk cache");
    EXPECT_EQ(k[i]["key"], j[i]["key"]);
  }
}

TEST_F(CliTest, BadArchIsAnErrorNamingArch) {
  CliResult r = Run({"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_5"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_EQ(r.signal, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "arch")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "sm_5")) << r.Describe();
  EXPECT_TRUE(EntryFiles().empty());
}

// CLI11 validation failures are usage errors; commands.h promises exit code 2 for them.
TEST_F(CliTest, HiddenZeroIsAUsageError) {
  CliResult r = Run({"compile", "--op", "rms_norm", "--hidden", "0", "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--hidden")) << r.Describe();
  EXPECT_TRUE(EntryFiles().empty());
}

TEST_F(CliTest, OtherUsageErrorsExitWith2) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {},                             // no subcommand
           {"compile", "--hidden", "64"},  // --op missing
           {"compile", "--op", "rms_norm", "--hidden", "64", "--no-such-flag"},
           {"cache", "frobnicate"}}) {
    CliResult r = Run(args);
    std::string line;
    for (const auto& a : args) line += a + " ";
    EXPECT_EQ(r.exit_code, 2) << "kjit " << line << "\n" << r.Describe();
  }
}

TEST_F(CliTest, UnsupportedDtypeIsAnErrorNamingDtype) {
  CliResult r =
      Run({"compile", "--op", "rms_norm", "--hidden", "64", "--dtype", "int8", "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_EQ(r.signal, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "dtype")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "int8")) << r.Describe();
  EXPECT_TRUE(EntryFiles().empty());
}

TEST_F(CliTest, CacheLsVerifyPruneClear) {
  CliResult c =
      Run({"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_90,sm_100", "--json"});
  ASSERT_EQ(c.exit_code, 0) << c.Describe();
  nlohmann::json built = nlohmann::json::parse(c.out, nullptr, false);
  ASSERT_TRUE(built.is_array() && built.size() == 2) << c.Describe();
  const std::string key90 = built[0]["key"], key100 = built[1]["key"];
  ASSERT_EQ(EntryFiles().size(), 2u);

  CliResult ls = Run({"cache", "ls"});
  ASSERT_EQ(ls.exit_code, 0) << ls.Describe();
  EXPECT_TRUE(Contains(ls.out, key90)) << ls.Describe();
  EXPECT_TRUE(Contains(ls.out, key100)) << ls.Describe();
  EXPECT_TRUE(Contains(ls.out, "2 entries")) << ls.Describe();
  EXPECT_TRUE(Contains(ls.out, "hidden=64")) << ls.Describe();

  CliResult ls_json = Run({"cache", "ls", "--json"});
  ASSERT_EQ(ls_json.exit_code, 0) << ls_json.Describe();
  nlohmann::json listed = nlohmann::json::parse(ls_json.out, nullptr, false);
  ASSERT_FALSE(listed.is_discarded()) << ls_json.Describe();
  ASSERT_EQ(listed["entries"].size(), 2u) << listed.dump(2);
  EXPECT_EQ(listed["invalid"], 0);
  EXPECT_EQ(listed["dir"], cache_);

  CliResult verify = Run({"cache", "verify"});
  EXPECT_EQ(verify.exit_code, 0) << verify.Describe();
  EXPECT_TRUE(Contains(verify.out, "0 invalid")) << verify.Describe();

  // Corrupt the sm_90 entry: flip a byte in the middle of the file.
  const std::string victim = cache_ + "/" + key90 + ".kjit";
  std::string bytes = ReadFile(victim);
  ASSERT_GT(bytes.size(), 100u);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x01);
  {
    std::ofstream out(victim, std::ios::binary | std::ios::trunc);
    out << bytes;
    ASSERT_TRUE(out.good());
  }

  CliResult bad = Run({"cache", "verify"});
  EXPECT_EQ(bad.exit_code, 1) << bad.Describe();
  std::string victim_line;
  for (std::istringstream in(bad.out); std::getline(in, victim_line);) {
    if (victim_line.starts_with(key90)) break;
  }
  EXPECT_TRUE(victim_line.starts_with(key90) && Contains(victim_line, "INVALID"))
      << "verify must name the corrupt entry INVALID\n"
      << bad.Describe();
  EXPECT_FALSE(Contains(bad.out, key100)) << "verify lists only the bad entries\n"
                                          << bad.Describe();
  EXPECT_TRUE(Contains(bad.out, "1 invalid")) << bad.Describe();

  CliResult ls_bad = Run({"cache", "ls"});
  EXPECT_EQ(ls_bad.exit_code, 0) << "ls reports, it does not judge\n" << ls_bad.Describe();

  CliResult prune = Run({"cache", "prune"});
  EXPECT_EQ(prune.exit_code, 0) << prune.Describe();
  EXPECT_TRUE(Contains(prune.out, "removed 1")) << prune.Describe();
  EXPECT_FALSE(fs::exists(victim));
  EXPECT_EQ(EntryFiles(), std::vector<std::string>{cache_ + "/" + key100 + ".kjit"});

  CliResult verify2 = Run({"cache", "verify"});
  EXPECT_EQ(verify2.exit_code, 0) << verify2.Describe();
  EXPECT_TRUE(Contains(verify2.out, "1 entries")) << verify2.Describe();

  CliResult clear = Run({"cache", "clear"});
  EXPECT_EQ(clear.exit_code, 0) << clear.Describe();
  EXPECT_TRUE(Contains(clear.out, "removed 1")) << clear.Describe();
  EXPECT_TRUE(EntryFiles().empty());

  CliResult empty = Run({"cache", "ls"});
  EXPECT_EQ(empty.exit_code, 0) << empty.Describe();
  EXPECT_TRUE(Contains(empty.out, "0 entries")) << empty.Describe();
}

TEST_F(CliTest, AutoArchWithoutAGpuBuildsTheDefaultTargets) {
  env_["KJIT_LIBCUDA_PATH"] = "/nonexistent/libcuda.so.1";
  CliResult r = Run({"compile", "--op", "rms_norm", "--hidden", "64", "--json"});  // --arch auto
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "no GPU")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "sm_90, sm_100")) << r.Describe();
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "the note must go to stderr, not into the JSON\n"
                                 << r.Describe();
  ASSERT_EQ(j.size(), 2u) << j.dump(2);
  EXPECT_EQ(j[0]["target"], "sm_90");
  EXPECT_EQ(j[1]["target"], "sm_100");
  EXPECT_EQ(EntryFiles().size(), 2u);
}

TEST_F(CliTest, BenchWithoutADriverFailsCleanly) {
  env_["KJIT_LIBCUDA_PATH"] = "/nonexistent/libcuda.so.1";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"bench", "--hidden", "64", "--rows", "4"},
        std::vector<std::string>{"bench", "--op", "cross_entropy", "--vocab", "1000", "--rows",
                                 "4"}}) {
    CliResult r = Run(args);
    EXPECT_EQ(r.signal, 0) << "crashed\n" << r.Describe();
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "no CUDA driver")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "fix")) << r.Describe();
    EXPECT_TRUE(r.out.empty()) << r.Describe();
  }
  CliResult bad = Run({"bench", "--op", "softmax"});
  EXPECT_EQ(bad.exit_code, 2) << bad.Describe();
  CliResult device = Run({"bench", "--device", "3"});
  EXPECT_EQ(device.exit_code, 1) << device.Describe();
  EXPECT_TRUE(Contains(device.err, "--device 3: no CUDA driver")) << device.Describe();
  CliResult negative = Run({"bench", "--device", "-1"});
  EXPECT_EQ(negative.exit_code, 2) << negative.Describe();
  EXPECT_TRUE(Contains(negative.err, "--device")) << negative.Describe();
}

// --config is parsed before any GPU is touched: a bad one is a usage error naming the flag and the
// field, with or without a GPU.
TEST_F(CliTest, BenchConfigIsCheckedFirst) {
  CliResult r = Run({"bench", "--op", "cross_entropy", "--config", "vec=8 threads=256"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--config:")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "\"unroll\" is missing")) << r.Describe();
  CliResult rms = Run({"bench", "--config", "vec=8 threads=256 unroll=4 cluster=4 staged=0"});
  EXPECT_EQ(rms.exit_code, 2) << rms.Describe();
  EXPECT_TRUE(Contains(rms.err, "--config:")) << rms.Describe();
  CliResult both = Run({"bench", "--op", "cross_entropy", "--sweep", "--config",
                        "vec=8 threads=256 unroll=4 cluster=4 staged=1"});
  EXPECT_EQ(both.exit_code, 2) << both.Describe();
  EXPECT_TRUE(Contains(both.err, "excludes")) << both.Describe();
}

// Each op's option flags belong to it and take its values, checked before any GPU is looked for.
TEST_F(CliTest, BenchOptionFlagsAreCheckedFirst) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"bench", "--op", "cross_entropy", "--casting", "none"},
       "--casting does not apply to --op cross_entropy"},
      {{"bench", "--op", "rms_norm", "--class-weights", "fp32"},
       "--class-weights does not apply to --op rms_norm"},
      {{"bench", "--op", "cross_entropy", "--class-weights", "fp16"},
       "--class-weights: class_weight_dtype: fp16 must be fp32 or the logits' dtype (bf16)"},
      {{"bench", "--op", "rms_norm", "--casting", "t5"}, "--casting"},
  };
  for (const auto& [args, message] : cases) {
    const CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_TRUE(Contains(r.err, message)) << r.Describe();
  }
  // Good ones pass the checks and stop at the missing driver.
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"bench", "--op", "rms_norm", "--casting", "none", "--hidden", "64"},
           {"bench", "--op", "cross_entropy", "--class-weights", "bf16", "--vocab", "1000"}}) {
    const CliResult r = Run(args);
    EXPECT_EQ(r.exit_code, 1) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "no CUDA driver")) << r.Describe();
  }
}

// `kjit compile` of each op with its size and an explicit target, and more flags.
std::vector<std::string> Rms(std::vector<std::string> more) {
  std::vector<std::string> args = {"compile", "--op",   "rms_norm", "--hidden",
                                   "64",      "--arch", "sm_90"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}
std::vector<std::string> Ce(std::vector<std::string> more) {
  std::vector<std::string> args = {"compile", "--op",   "cross_entropy", "--vocab",
                                   "1000",    "--arch", "sm_90"};
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Issue 18, defect 6: README's rule, usage errors exit 2 and failures 1, for every flag of every
// subcommand: a bad value (wrong type, out of range, empty, an unknown word), a flag that does not
// apply, conflicting flags. Each is found by parsing alone (no GPU here, so `bench` would fail with
// 1 once its flags passed), is reported on stderr naming the flag, and nothing is built.
TEST_F(CliTest, EveryBadFlagIsAUsageErrorNamingTheFlag) {
  env_["KJIT_LIBCUDA_PATH"] = "/nonexistent/libcuda.so.1";
  const struct {
    std::vector<std::string> args;
    std::string named;  // what stderr must contain: the flag (or the word) at fault
  } cases[] = {
      // kjit itself.
      {{"frobnicate"}, "\"frobnicate\""},
      {{"--trace", "", "cache", "ls"}, "--trace"},
      {{"--trace"}, "--trace"},
      // kjit compile.
      {{"compile", "--hidden", "64"}, "--op"},
      {{"compile", "--op", "softmax", "--hidden", "64"}, "--op"},
      {{"compile", "--op", "", "--hidden", "64"}, "--op"},
      {{"compile", "--op", "rms_norm", "--arch", "sm_90"}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", "x"}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", "0"}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", "65537"}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", "64.5"}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", ""}, "--hidden"},
      {{"compile", "--op", "rms_norm", "--hidden", "0x40"}, "--hidden: '0x40' is not a decimal"},
      {{"compile", "--op", "rms_norm", "--hidden", "+64"}, "--hidden: '+64' is not a decimal"},
      {{"compile", "--op", "rms_norm", "--hidden", " 64"}, "--hidden: ' 64' is not a decimal"},
      {{"compile", "--op", "rms_norm", "--hidden", "0100000"}, "--hidden"},  // 100000, not 32768
      {Ce({"--hidden", "64"}), "--hidden"},
      {{"compile", "--op", "cross_entropy", "--arch", "sm_90"}, "--vocab"},
      {{"compile", "--op", "cross_entropy", "--vocab", "1"}, "--vocab"},
      {{"compile", "--op", "cross_entropy", "--vocab", "x"}, "--vocab"},
      {{"compile", "--op", "cross_entropy", "--vocab", ""}, "--vocab"},
      {Rms({"--vocab", "1000"}), "--vocab"},
      {Rms({"--dtype", "bf17"}), "--dtype"},
      {Rms({"--dtype", "int8"}), "--dtype"},
      {Rms({"--dtype", ""}), "--dtype"},
      {Rms({"--weight-dtype", "bf17"}), "--weight-dtype"},
      {Rms({"--weight-dtype", ""}), "--weight-dtype"},
      {Ce({"--weight-dtype", "fp32"}), "--weight-dtype"},
      {Rms({"--casting", "gemmma"}), "--casting"},
      {Rms({"--casting", ""}), "--casting"},
      {Ce({"--casting", "gemma"}), "--casting"},
      {Rms({"--residual=maybe"}), "--residual"},
      {Ce({"--residual"}), "--residual"},
      {Ce({"--target-type", "int16"}), "--target-type"},
      {Rms({"--target-type", "int32"}), "--target-type"},
      {Ce({"--reduction", "avg"}), "--reduction"},
      {Rms({"--reduction", "sum"}), "--reduction"},
      {Ce({"--label-smoothing", "1"}), "--label-smoothing"},
      {Ce({"--label-smoothing", "-0.1"}), "--label-smoothing"},
      {Ce({"--label-smoothing", "nan"}), "--label-smoothing"},
      {Ce({"--label-smoothing", "x"}), "--label-smoothing"},
      {Ce({"--label-smoothing", ""}), "--label-smoothing"},
      {Rms({"--label-smoothing", "0.1"}), "--label-smoothing"},
      {Ce({"--z-loss", "-1"}), "--z-loss"},
      {Ce({"--z-loss", "inf"}), "--z-loss"},
      {Ce({"--z-loss", "x"}), "--z-loss"},
      {Rms({"--z-loss", "0.0001"}), "--z-loss"},
      {Ce({"--softcap", "-1"}), "--softcap"},
      {Ce({"--softcap", "nan"}), "--softcap"},
      {Rms({"--softcap", "30"}), "--softcap"},
      {Ce({"--argmax=maybe"}), "--argmax"},
      {Rms({"--argmax"}), "--argmax"},
      {Ce({"--class-weights", "fp16"}), "--class-weights"},  // neither fp32 nor --dtype (bf16)
      {Ce({"--class-weights", "int8"}), "--class-weights"},
      {Rms({"--class-weights", "fp32"}), "--class-weights"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", ""}, "--arch"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", ","}, "--arch"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_10"}, "--arch"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_90,x"}, "--arch"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "auto,sm_90"}, "--arch"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_999"}, "--arch"},
      {Rms({"--json=maybe"}), "--json"},
      {Rms({"--no-such-flag"}), "--no-such-flag"},
      {Rms({"extra"}), "extra"},
      // kjit bench: each before the GPU is looked for.
      {{"bench", "--op", "softmax"}, "--op"},
      {{"bench", "--op", ""}, "--op"},
      {{"bench", "--hidden", "0"}, "--hidden"},
      {{"bench", "--hidden", "x"}, "--hidden"},
      {{"bench", "--hidden", ""}, "--hidden"},
      {{"bench", "--op", "cross_entropy", "--hidden", "64"}, "--hidden"},
      {{"bench", "--op", "cross_entropy", "--vocab", "1"}, "--vocab"},
      {{"bench", "--vocab", "1000"}, "--vocab"},
      {{"bench", "--rows", "0"}, "--rows"},
      {{"bench", "--rows", "x"}, "--rows"},
      {{"bench", "--rows", "4294967296"}, "--rows"},
      {{"bench", "--rows", "2147483648"}, "--rows"},  // 2^31: a launch takes at most 2^31 - 1
      {{"bench", "--op", "linear_cross_entropy", "--rows", "2147483648"}, "--rows"},
      {{"bench", "--dtype", "bf17"}, "--dtype"},
      {{"bench", "--dtype", ""}, "--dtype"},
      {{"bench", "--repeats", "2"}, "--repeats"},
      {{"bench", "--repeats", "x"}, "--repeats"},
      {{"bench", "--device", "-1"}, "--device"},
      {{"bench", "--device", "4096"}, "--device"},
      {{"bench", "--device", "x"}, "--device"},
      {{"bench", "--json=maybe"}, "--json"},
      {{"bench", "--sweep=maybe"}, "--sweep"},
      {{"bench", "--op", "cross_entropy", "--config", "vec=8 threads=256"}, "--config"},
      {{"bench", "--op", "cross_entropy", "--config", "vec=8 fwd=128x1 bwd=512x1"}, "--config"},
      {{"bench", "--config", ""}, "--config"},
      {{"bench", "--sweep", "--config", "vec=8 fwd=128x1 bwd=512x1"}, "--config"},
      {{"bench", "--output", ""}, "--output"},
      {{"bench", "--frob"}, "--frob"},
      // kjit cache.
      {{"cache"}, "action"},
      {{"cache", "frobnicate"}, "action"},
      {{"cache", ""}, "action"},
      {{"cache", "ls", "--json=maybe"}, "--json"},
      {{"cache", "ls", "--all"}, "--all"},
      {{"cache", "ls", "extra"}, "extra"},
      // kjit doctor.
      {{"doctor", "--arch", ""}, "--arch"},
      {{"doctor", "--arch", ","}, "--arch"},
      {{"doctor", "--arch", "sm_5"}, "--arch"},
      {{"doctor", "--arch", "x"}, "--arch"},
      {{"doctor", "--json=maybe"}, "--json"},
      {{"doctor", "--fix-cache=maybe"}, "--fix-cache"},
      {{"doctor", "--no-launch=maybe"}, "--no-launch"},
      {{"doctor", "--op", "rms_norm"}, "--op"},
  };
  for (const auto& c : cases) {
    const CliResult r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << "kjit " << Joined(c.args) << "\n" << r.Describe();
    EXPECT_TRUE(r.err.starts_with("kjit: ")) << "kjit " << Joined(c.args) << "\n" << r.Describe();
    EXPECT_TRUE(Contains(r.err, c.named))
        << "kjit " << Joined(c.args) << ": stderr must name " << c.named << "\n"
        << r.Describe();
    EXPECT_TRUE(r.out.empty()) << "kjit " << Joined(c.args) << "\n" << r.Describe();
  }
  EXPECT_TRUE(EntryFiles().empty());
}

// The issue's own cases, message and all: each was a failure (exit 1), or was accepted.
TEST_F(CliTest, UsageErrorsSayWhatIsWrongWithTheFlag) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {Rms({"--dtype", "bf17"}),
       "kjit: --dtype: \"bf17\" is not supported; expected fp32, fp16 or bf16\n"},
      {Rms({"--weight-dtype", "bf17"}),
       "kjit: --weight-dtype: \"bf17\" is not supported; expected fp32, fp16 or bf16\n"},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_10"},
       "kjit: --arch: 'sm_10' is not a target; expected sm_XY"},
      // Parses, but no NVRTC can compile for it: as much a mistake in the flags.
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_51"},
       "kjit: --arch: this NVRTC cannot compile for sm_51 (it supports: "},
      {{"compile", "--op", "rms_norm", "--hidden", "64", "--arch", ""},
       "kjit: --arch: no target; expected auto or a list such as sm_90,sm_100\n"},
      {Ce({"--label-smoothing", "1"}), "kjit: --label-smoothing: 1 must be in [0, 1)\n"},
      {Ce({"--z-loss", "-1"}), "kjit: --z-loss: -1 must be finite and not negative\n"},
      // Casting none computes in the dtype: the weight must have it.
      {Rms({"--casting", "none", "--weight-dtype", "fp32"}),
       "kjit: --weight-dtype: fp32 must be the dtype (bf16) with casting none"},
      {{"doctor", "--arch", ","},
       "kjit: --arch: no target; expected a list such as sm_90,sm_100\n"},
      {{"bench", "--dtype", "bf17"},
       "kjit: --dtype: \"bf17\" is not supported; expected fp32, fp16 or bf16\n"},
      {{"bench", "--op", "cross_entropy", "--hidden", "64"},
       "kjit: --hidden does not apply to --op cross_entropy\n"},
      // Issue 34: 2^31 was accepted, though a launch takes at most 2^31 - 1 rows.
      {{"bench", "--rows", "2147483648"},
       "kjit: --rows: Value 2147483648 not in range 1 to 2147483647\n"},
  };
  for (const auto& c : cases) ExpectUsageError(c.args, c.message);
}

// Issue 45, defects 11 and 12: a number is quoted as given beside the float it became (it said "1
// must be in [0, 1)" of 0.9999999999 and "inf must be finite" of 1e39); a 100 KB --config came
// back twice, whole (200 KB), and any argument CLI11 did not expect once, whole; escape sequences
// in them reached the terminal raw.
TEST_F(CliTest, UsageErrorsQuoteWhatWasGivenEscapedAndCut) {
  const std::string big(100000, 'x');
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {Ce({"--label-smoothing", "0.9999999999"}),
       "kjit: --label-smoothing: \"0.9999999999\" (1 as a float) must be in [0, 1)\n"},
      {Ce({"--z-loss", "1e39"}),
       "kjit: --z-loss: \"1e39\" (inf as a float) must be finite and not negative\n"},
      {Ce({big}), "kjit: The following argument was not expected: xxxxxxxxxx"},
      {Ce({"\x1b[2J"}), "kjit: The following argument was not expected: \\x1b[2J\n"},
      {{"bench", "--op", "cross_entropy", "--vocab", "1000", "--config", "vec=8\x1b[2J"},
       "kjit: --config: cross-entropy config \"vec=8\\x1b[2J\": field \"threads\" is "
       "missing\n"},
      {{"bench", "--op", "cross_entropy", "--vocab", "1000", "--config", big},
       "kjit: --config: cross-entropy config \"" + std::string(64, 'x') + "...\" (100000 bytes): "},
  };
  for (const auto& c : cases) {
    ExpectUsageError(c.args, c.message);
    const CliResult r = Run(c.args);
    EXPECT_LT(r.err.size(), 1000u) << r.err.substr(0, 1000);
    EXPECT_FALSE(Contains(r.err, "\x1b")) << r.Describe();
  }
}

// Issue 18, defect 12: `--argmax --softcap 30` on rms_norm and `--residual --casting gemma` on
// cross_entropy were ignored (exit 0) while --vocab on rms_norm was refused; now every flag of one
// op is refused with the other, naming the flags and the op, and nothing is compiled.
TEST_F(CliTest, FlagsOfAnotherOpAreRefused) {
  const struct {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {Rms({"--argmax", "--softcap", "30"}),
       "kjit: --softcap, --argmax do not apply to --op rms_norm\n"},
      {Ce({"--residual", "--casting", "gemma"}),
       "kjit: --casting, --residual do not apply to --op cross_entropy\n"},
      {Rms({"--vocab", "1000"}), "kjit: --vocab does not apply to --op rms_norm\n"},
      {Ce({"--weight-dtype", "fp32"}),
       "kjit: --weight-dtype does not apply to --op cross_entropy\n"},
      {Rms({"--target-type", "int32", "--reduction", "sum", "--label-smoothing", "0.1", "--z-loss",
            "0.001"}),
       "kjit: --target-type, --reduction, --label-smoothing, --z-loss do not apply to --op "
       "rms_norm\n"},
  };
  for (const auto& c : cases) ExpectUsageError(c.args, c.message);
  EXPECT_TRUE(EntryFiles().empty());
  // Each op's own flags still go through.
  CliResult rms = Run(Rms({"--weight-dtype", "fp32", "--casting", "gemma", "--residual"}));
  EXPECT_EQ(rms.exit_code, 0) << rms.Describe();
  rms = Run(Rms({"--casting", "none", "--dtype", "fp16"}));
  EXPECT_EQ(rms.exit_code, 0) << rms.Describe();
  EXPECT_TRUE(Contains(rms.out, "casting=none")) << rms.Describe();
  CliResult ce = Run(Ce({"--target-type", "int32", "--reduction", "sum", "--label-smoothing", "0.1",
                         "--z-loss", "0.001", "--softcap", "30", "--argmax"}));
  EXPECT_EQ(ce.exit_code, 0) << ce.Describe();
  for (const char* param : {"target_type=int32", "reduction=sum", "label_smoothing=0.1",
                            "z_loss=0.001", "softcap=30", "argmax=true"}) {
    EXPECT_TRUE(Contains(ce.out, param)) << param << "\n" << ce.Describe();
  }
}

// Issue 18: `kjit frobnicate` said "A subcommand is required" without naming the word.
TEST_F(CliTest, AnUnknownCommandIsNamed) {
  CliResult r = Run({"frobnicate"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(r.err.starts_with(
      "kjit: unknown command \"frobnicate\"; commands: doctor, compile, cache, bench\n"))
      << r.Describe();
  r = Run({});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(
      r.err.starts_with("kjit: a command is required; commands: doctor, compile, cache, bench\n"))
      << r.Describe();
  r = Run({"--bogus"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(r.err.starts_with("kjit: unknown option \"--bogus\"")) << r.Describe();
}

TEST_F(CliTest, BenchWithTheStubDriverFailsCleanly) {
  env_["KJIT_LIBCUDA_PATH"] = kjit::testing::StubLibcuda();
  CliResult r = Run({"bench", "--hidden", "64", "--rows", "4"});
  EXPECT_EQ(r.signal, 0) << "crashed\n" << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "CUDA_ERROR_STUB_LIBRARY")) << r.Describe();
}

// Issue 34 (1): a long output to a full or closed stdout, or to a pipe without a reader while
// SIGPIPE is ignored, aborted (exit 134, "terminate called after throwing std::system_error"); a
// short one was lost with exit 0. Both are failures: one line on stderr, exit 1.
TEST_F(CliTest, OutputThatCannotBeWrittenIsAFailure) {
  const std::vector<std::string> long_output = {
      "compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_90,sm_100,sm_80,sm_120",
      "--json"};
  const CliResult printed = Run(long_output);
  ASSERT_EQ(printed.exit_code, 0) << printed.Describe();
  ASSERT_GT(printed.out.size(), 4096u) << "not longer than stdout's buffer";
  const std::string short_line = "kjit: cannot write to standard output";
  for (const std::vector<std::string>& args :
       {long_output, std::vector<std::string>{"--help"}, std::vector<std::string>{"--version"},
        std::vector<std::string>{"cache", "ls"}}) {
    for (auto [to, why] : {std::pair{testing::Stdout::kFull, ": No space left on device\n"},
                           std::pair{testing::Stdout::kClosed, ": Bad file descriptor\n"},
                           std::pair{testing::Stdout::kBrokenPipe, ": Broken pipe\n"}}) {
      const CliResult r = Run(args, to);
      EXPECT_EQ(r.signal, 0) << "kjit " << Joined(args) << "\n" << r.Describe();
      EXPECT_EQ(r.exit_code, 1) << "kjit " << Joined(args) << "\n" << r.Describe();
      EXPECT_EQ(r.err, short_line + why) << "kjit " << Joined(args) << "\n" << r.Describe();
    }
  }
}

// Issue 34 (4): integers were read as strtoll's base 0 reads them: --vocab 032000 compiled vocab
// 13312 and --hidden 010 hidden 8. They are decimal: leading zeros mean nothing.
TEST_F(CliTest, IntegersAreDecimal) {
  const CliResult r =
      Run({"compile", "--op", "rms_norm", "--hidden", "0096", "--arch", "sm_90", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(nlohmann::json::parse(r.out)[0]["params"]["hidden"], "96") << r.out;
}

// Issue 34 (5): `kjit compile --op rms_norm --hidden 64 --arch sm_75` was an INTERNAL error with
// 13.6 KB of ptxas output (and a NUL in it), exit 1. A dtype a target cannot hold is a usage error.
TEST_F(CliTest, Bf16BelowSm80IsAUsageError) {
  const std::string why = ": bf16 needs sm_80 or newer, the target is sm_75; use fp16 or fp32\n";
  ExpectUsageError({"compile", "--op", "rms_norm", "--hidden", "64", "--arch", "sm_90,sm_75"},
                   "kjit: --dtype" + why);
  ExpectUsageError({"compile", "--op", "rms_norm", "--hidden", "64", "--dtype", "fp32",
                    "--weight-dtype", "bf16", "--arch", "sm_75"},
                   "kjit: --weight-dtype" + why);
  EXPECT_TRUE(EntryFiles().empty()) << "nothing is compiled";
  const CliResult r =
      Run({"compile", "--op", "rms_norm", "--hidden", "64", "--dtype", "fp16", "--arch", "sm_75"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(EntryFiles().size(), 1u) << r.Describe();
}

}  // namespace
}  // namespace kjit::tools
