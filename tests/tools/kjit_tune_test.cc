// `kjit-tune` run as a subprocess without a GPU: it compiles the kernels a model needs for sm_90
// and sm_100 into a fresh cache, a second run finds all of them there, and bad flags or files get a
// clear message and a non-zero exit.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/temp_dir.h"
#include "tests/test_support.h"

#ifndef KJIT_TUNE_PATH
#error "KJIT_TUNE_PATH must name the built kjit-tune binary"
#endif

namespace kjit::tools {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;

class KjitTuneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(tmp_.ok());
    root_ = tmp_.path();
    env_["KJIT_CACHE_DIR"] = root_ + "/cache";
    env_["KJIT_CACHE_MAX_BYTES"] = "";
    env_["KJIT_LIBCUDA_PATH"] = root_ + "/no-libcuda.so";  // "no GPU", even on a GPU machine
  }
  CliResult Run(const std::vector<std::string>& args,
                testing::Stdout to = testing::Stdout::kCaptured) {
    return testing::RunProgram(KJIT_TUNE_PATH, args, env_, root_, to);
  }
  testing::TempDir tmp_{"kjit_tune_test"};
  std::string root_;
  std::map<std::string, std::string> env_;
};

TEST_F(KjitTuneTest, CompileOnlyFillsTheCacheSoASecondRunCompilesNothing) {
  const CliResult first = Run({"--model", "llama-3.2-1b", "--compile-only", "--json"});
  ASSERT_EQ(first.exit_code, 0) << first.Describe();
  const auto report = nlohmann::json::parse(first.out);
  EXPECT_EQ(report["hidden_size"], 2048);
  EXPECT_EQ(report["vocab_size"], 128256);
  std::set<std::string> targets, ops;
  for (const auto& k : report["kernels"]) {
    targets.insert(k["target"].get<std::string>());
    ops.insert(k["op"].get<std::string>());
    EXPECT_EQ(k["origin"], "compiled") << k.dump();
    EXPECT_EQ(k["tuned"], false) << "nothing is timed without a GPU";
    EXPECT_TRUE(fs::exists(k["path"].get<std::string>())) << k.dump();
  }
  EXPECT_EQ(targets, (std::set<std::string>{"sm_90", "sm_100"}));
  EXPECT_EQ(ops, (std::set<std::string>{"rms_norm", "rms_norm+residual", "cross_entropy",
                                        "linear_cross_entropy"}));
  EXPECT_NE(first.err.find("nothing is timed"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("8 of 8 kernels ready"), std::string::npos) << first.err;

  const CliResult second = Run({"--model", "llama-3.2-1b", "--compile-only", "--json"});
  ASSERT_EQ(second.exit_code, 0) << second.Describe();
  const nlohmann::json again = nlohmann::json::parse(second.out);
  for (const auto& k : again["kernels"]) {
    EXPECT_EQ(k["origin"], "disk cache") << k.dump();
  }
}

// Issue 34, defect 6: with --jobs 2 every worker replaced the --trace file at its exit, so it held
// one process's events. Now every process's land in it (one pid each), and a second run starts
// the file afresh rather than adding to the first's.
TEST_F(KjitTuneTest, TheTraceHoldsEveryProcesssEvents) {
  const std::string trace = root_ + "/t.json";
  std::set<int> runs[2];
  for (std::set<int>& pids : runs) {
    env_["KJIT_CACHE_DIR"] = root_ + "/cache" + std::to_string(&pids - runs);  // all compiled
    const CliResult r = Run({"--trace", trace, "--vocab", "1236", "--hidden", "104",
                             "--compile-only", "--arch", "sm_90", "--jobs", "2"});
    ASSERT_EQ(r.exit_code, 0) << r.Describe();
    const nlohmann::json doc = nlohmann::json::parse(testing::ReadFile(trace));
    std::set<std::string> names;
    for (const auto& e : doc["traceEvents"]) {
      pids.insert(e["pid"].get<int>());
      names.insert(e["name"].get<std::string>());
    }
    EXPECT_GE(pids.size(), 3u) << "kjit-tune and its two workers: " << doc.dump();
    for (const char* op : {"rms_norm", "cross_entropy.forward", "linear_cross_entropy"}) {
      EXPECT_TRUE(names.count(std::string("nvrtc ") + op)) << op << ": " << doc.dump();
    }
  }
  for (int pid : runs[1]) EXPECT_EQ(runs[0].count(pid), 0u) << "the first run's events are kept";
}

TEST_F(KjitTuneTest, ReadsAHuggingFaceConfigFile) {
  const std::string path = root_ + "/config.json";
  std::ofstream(path) << R"({"model_type": "gemma2", "hidden_size": 256, "vocab_size": 1000,
                             "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0})";
  const CliResult r = Run({"--config", path, "--arch", "sm_90", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["vocab_size"], 1000);
  EXPECT_EQ(report["kernels"].size(), 4u);
}

TEST_F(KjitTuneTest, BadInputGetsAClearErrorAndExitCode) {
  CliResult r = Run({"--model", "llama-9"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("known: llama-3.1-8b"), std::string::npos) << r.err;
  r = Run({"--model", "llama-3.1-8b", "--vocab", "1000", "--hidden", "64"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("one of --model, --config"), std::string::npos) << r.err;
  r = Run({"--vocab", "1000"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  r = Run({"--tokens", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();

  const std::string path = root_ + "/bad.json";
  std::ofstream(path) << R"({"hidden_size": "big", "vocab_size": 1000})";
  r = Run({"--config", path, "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("\"hidden_size\" must be a positive integer"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(root_ + "/cache")) << "nothing was compiled";
}

// --device names the GPU to tune on: without one it is an error that names the flag, not the
// silent fallback to compiling that the default (auto) takes; it makes no sense with compile-only
// runs; and the workers it starts take the same ordinal.
TEST_F(KjitTuneTest, AnExplicitDeviceIsRequiredNotFallenBackFrom) {
  CliResult r = Run({"--model", "llama-3.2-1b", "--device", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_NE(r.err.find("--device 0: no CUDA driver"), std::string::npos) << r.err;
  if (fs::exists(root_ + "/cache")) {
    for (const auto& e : fs::recursive_directory_iterator(root_ + "/cache")) {
      EXPECT_FALSE(e.is_regular_file()) << "nothing is compiled: " << e.path();
    }
  }
  r = Run({"--device", "-1"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("--device"), std::string::npos) << r.err;
  r = Run({"--device", "0", "--compile-only"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("cannot go with --compile-only"), std::string::npos) << r.err;
  r = Run({"--device", "1", "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("cannot go with --arch sm_90"), std::string::npos) << r.err;
  for (const auto& worker_args : std::vector<std::vector<std::string>>{
           {"--worker"}, {"--worker", "--device"}, {"--worker", "--device", "1x"}}) {
    r = Run(worker_args);
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_NE(r.err.find("--worker takes exactly --device N"), std::string::npos) << r.err;
  }
}

// --spec: one op as a runtime with KJIT_AUTOTUNE describes it; a bad one is a usage error.
TEST_F(KjitTuneTest, TunesOneOpFromASpec) {
  const std::string spec =
      R"({"op":"cross_entropy","vocab":1000,"dtype":"fp16","target_type":"int32",)"
      R"("ignore_index":-1,"reduction":"sum","label_smoothing":0.1,)"
      R"("lse_square_scale":0,"softcap":0,"argmax":false})";
  CliResult r = Run({"--spec", spec, "--arch", "sm_90", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const auto report = nlohmann::json::parse(r.out);
  ASSERT_EQ(report["kernels"].size(), 1u) << r.out;
  EXPECT_EQ(report["kernels"][0]["shape"], "vocab=1000 smoothing");
  EXPECT_EQ(report["kernels"][0]["dtype"], "fp16");
  r = Run({"--spec", R"({"op":"cross_entropy","vocab":1})", "--arch", "sm_90"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("--spec: dtype: is missing"), std::string::npos) << r.err;
  r = Run({"--spec", spec, "--model", "llama-3.1-8b"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  r = Run({"--spec", spec, "--class-weights", "fp32"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("--class-weights does not apply to --spec"), std::string::npos) << r.err;
  // A weighted loss is its own tuning record, from --spec or from a model's flags.
  r = Run({"--spec",
           R"({"op":"cross_entropy","vocab":1000,"dtype":"bf16","target_type":"int64",)"
           R"("ignore_index":-100,"reduction":"mean","label_smoothing":0,)"
           R"("lse_square_scale":0,"softcap":0,"argmax":false,)"
           R"("class_weight_dtype":"bf16"})",
           "--arch", "sm_90", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(nlohmann::json::parse(r.out)["kernels"][0]["shape"], "vocab=1000 class_weights");
}

// --casting and --class-weights change the model's ops: its norms' casting, its loss's weights.
TEST_F(KjitTuneTest, CastingAndClassWeightsOverrideTheModel) {
  CliResult r = Run({"--vocab", "1000", "--hidden", "64", "--casting", "none", "--class-weights",
                     "fp32", "--arch", "sm_90", "--tokens", "16", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::set<std::string> shapes;
  const nlohmann::json report = nlohmann::json::parse(r.out);
  for (const auto& k : report["kernels"]) shapes.insert(k["shape"].get<std::string>());
  EXPECT_EQ(shapes.count("hidden=64 none"), 1u) << r.out;
  EXPECT_EQ(shapes.count("vocab=1000 class_weights"), 1u) << r.out;
  r = Run({"--vocab", "1000", "--hidden", "64", "--class-weights", "fp16"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_NE(r.err.find("--class-weights fp16: must be fp32 or --dtype (bf16)"), std::string::npos)
      << r.err;
  r = Run({"--vocab", "1000", "--hidden", "64", "--casting", "t5"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
}

// The command line as one string, for failure messages.
std::string Joined(const std::vector<std::string>& args) {
  std::string line;
  for (const std::string& a : args) line += (line.empty() ? "" : " ") + ("'" + a + "'");
  return line;
}

// A valid --spec of each op.
const nlohmann::json kRmsSpec = {
    {"op", "rms_norm"},   {"hidden", 256},      {"dtype", "bf16"},        {"eps", 1e-5},
    {"weight_offset", 0}, {"casting", "llama"}, {"fused_residual", false}};
const nlohmann::json kCeSpec = {{"op", "cross_entropy"}, {"vocab", 1000},
                                {"dtype", "bf16"},       {"target_type", "int64"},
                                {"ignore_index", -100},  {"reduction", "mean"},
                                {"label_smoothing", 0},  {"lse_square_scale", 0},
                                {"softcap", 0},          {"argmax", false}};

// The spec with one field's value (JSON text) replaced, as --spec takes it.
std::string With(nlohmann::json spec, const std::string& field, const std::string& value) {
  spec[field] = nlohmann::json::parse(value);
  return spec.dump();
}

// Issue 18, defect 6: README's rule for every flag of kjit-tune: a bad value (wrong type, out of
// range, empty, an unknown word), a flag that does not apply, conflicting flags are usage errors
// (exit 2) found by parsing alone, named on stderr, every line of which starts with "kjit-tune:";
// nothing is compiled.
TEST_F(KjitTuneTest, EveryBadFlagIsAUsageErrorNamingTheFlag) {
  const std::string config = root_ + "/config.json";
  std::ofstream(config) << R"({"hidden_size": 256, "vocab_size": 1000})";
  const struct {
    std::vector<std::string> args;
    std::string named;  // what stderr must contain: the flag at fault
  } cases[] = {
      {{"--model", "llama-9"}, "--model"},
      {{"--model", ""}, "--model"},
      {{"--config", ""}, "--config"},
      {{"--config", config, "--model", "llama-3.2-1b"}, "--config"},
      {{"--spec", ""}, "--spec"},
      {{"--spec", "not json"}, "--spec"},
      {{"--spec", "[]"}, "--spec"},
      {{"--spec", With(kRmsSpec, "hidden", "4096.5")}, "--spec: hidden: 4096.5 is not an integer"},
      {{"--spec", kRmsSpec.dump(), "--model", "llama-3.2-1b"}, "--spec"},
      {{"--spec", kRmsSpec.dump(), "--config", config}, "--spec"},
      {{"--spec", kRmsSpec.dump(), "--dtype", "fp16"}, "--dtype"},
      {{"--vocab", "1"}, "--vocab"},
      {{"--vocab", "x", "--hidden", "64"}, "--vocab"},
      {{"--vocab", "", "--hidden", "64"}, "--vocab"},
      {{"--vocab", "1000"}, "--vocab and --hidden go together"},
      {{"--vocab", "1000", "--hidden", "64", "--model", "llama-3.2-1b"}, "--vocab"},
      {{"--hidden", "64"}, "--hidden"},
      {{"--hidden", "0", "--vocab", "1000"}, "--hidden"},
      {{"--hidden", "x", "--vocab", "1000"}, "--hidden"},
      {{"--dtype", "bf17"}, "--dtype"},
      {{"--dtype", ""}, "--dtype"},
      {{"--dtype", "int8"}, "--dtype"},
      {{"--tokens", "0"}, "--tokens"},
      {{"--tokens", "x"}, "--tokens"},
      {{"--tokens", ""}, "--tokens"},
      {{"--tokens", "1024,4294967296"}, "--tokens"},
      {{"--tokens", "2147483648"}, "--tokens"},  // a launch takes at most 2^31 - 1 rows
      {{"--tokens", "1024,0x400"}, "--tokens: '0x400' is not a decimal integer"},
      {{"--vocab", "0x3e8", "--hidden", "64"}, "--vocab: '0x3e8' is not a decimal integer"},
      {{"--arch", ""}, "--arch"},
      {{"--arch", ","}, "--arch"},
      {{"--arch", "sm_10"}, "--arch"},
      {{"--arch", "sm_999"}, "--arch"},
      {{"--arch", "sm_90,auto"}, "--arch"},
      {{"--vocab", "1000", "--hidden", "64", "--arch", "sm_75"},
       "--dtype: bf16 needs sm_80 or newer, the target is sm_75; use fp16 or fp32"},
      {{"--device", "-1"}, "--device"},
      {{"--device", "x"}, "--device"},
      {{"--device", "4096"}, "--device"},
      {{"--device", "0", "--compile-only"}, "--device"},
      {{"--device", "0", "--arch", "sm_90"}, "--device"},
      {{"--compile-only=maybe"}, "--compile-only"},
      {{"--all-candidates=maybe"}, "--all-candidates"},
      {{"--retune=maybe"}, "--retune"},
      {{"--retune", "--compile-only"}, "--retune"},
      {{"--retune", "--arch", "sm_90"}, "--retune"},
      {{"--jobs", "0"}, "--jobs"},
      {{"--jobs", "257"}, "--jobs"},
      {{"--jobs", "x"}, "--jobs"},
      {{"--repeats", "2"}, "--repeats"},
      {{"--repeats", "x"}, "--repeats"},
      {{"--repeats", "5", "--compile-only"}, "--repeats"},
      {{"--timeout", "0"}, "--timeout"},
      {{"--timeout", "3601"}, "--timeout"},
      {{"--db", ""}, "--db"},
      {{"--db"}, "--db"},
      {{"--json=maybe"}, "--json"},
      {{"--trace", ""}, "--trace"},
      {{"--frob"}, "--frob"},
      {{"extra"}, "extra"},
  };
  for (const auto& c : cases) {
    const CliResult r = Run(c.args);
    EXPECT_EQ(r.exit_code, 2) << "kjit-tune " << Joined(c.args) << "\n" << r.Describe();
    EXPECT_NE(r.err.find(c.named), std::string::npos)
        << "kjit-tune " << Joined(c.args) << ": stderr must name " << c.named << "\n"
        << r.Describe();
    std::istringstream lines(r.err);
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("Run with --help")) continue;
      EXPECT_TRUE(line.starts_with("kjit-tune: ")) << "kjit-tune " << Joined(c.args) << "\n"
                                                   << r.Describe();
    }
    EXPECT_TRUE(r.out.empty()) << "kjit-tune " << Joined(c.args) << "\n" << r.Describe();
  }
  EXPECT_FALSE(fs::exists(root_ + "/cache")) << "nothing was compiled";
}

// Issue 18, defect 6: `--config F --model M` exited 1 where `--spec S --model M` exited 2, with
// the same message; both are the same usage error. A config file that cannot be read is still a
// failure (1), as the file is read only once the flags are good.
TEST_F(KjitTuneTest, TwoSourcesOfOpsAreOneUsageError) {
  const std::string config = root_ + "/config.json";
  std::ofstream(config) << R"({"hidden_size": 256, "vocab_size": 1000})";
  for (const std::string& other : {std::string("--config"), std::string("--spec")}) {
    const CliResult r =
        Run({other, other == "--config" ? config : kRmsSpec.dump(), "--model", "llama-9"});
    EXPECT_EQ(r.exit_code, 2) << other << "\n" << r.Describe();
    EXPECT_TRUE(
        r.err.starts_with("kjit-tune: give one of --model, --config, --vocab/--hidden or --spec\n"))
        << other << "\n"
        << r.Describe();
  }
  const CliResult missing = Run({"--config", root_ + "/none.json", "--arch", "sm_90"});
  EXPECT_EQ(missing.exit_code, 1) << missing.Describe();
  EXPECT_TRUE(missing.err.starts_with("kjit-tune: ")) << missing.Describe();
  EXPECT_NE(missing.err.find("none.json"), std::string::npos) << missing.Describe();
}

// Issue 18, defect 7: `--spec ''` tuned the default model (llama-3.1-8b) and exited 0.
TEST_F(KjitTuneTest, AnEmptySpecIsAUsageError) {
  const CliResult r = Run({"--spec", "", "--arch", "sm_90", "--json"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(r.err.starts_with("kjit-tune: --spec: must not be empty\n")) << r.Describe();
  EXPECT_TRUE(r.out.empty()) << r.Describe();
  EXPECT_FALSE(fs::exists(root_ + "/cache")) << "nothing was compiled";
}

// Issue 18, defect 8: numbers in --spec were truncated (4096.5 tuned hidden=4096) or wrapped (1e20,
// 2^64-1), and a string said "type must be number, but is string" without the field.
TEST_F(KjitTuneTest, SpecNumbersAreCheckedNamingTheField) {
  const struct {
    std::string spec, message;
  } cases[] = {
      {With(kRmsSpec, "hidden", "4096.5"), "kjit-tune: --spec: hidden: 4096.5 is not an integer\n"},
      {With(kCeSpec, "vocab", "1e20"), "kjit-tune: --spec: vocab: 1e+20 is not an integer\n"},
      {With(kCeSpec, "vocab", "18446744073709551615"),
       "kjit-tune: --spec: vocab: 18446744073709551615 is out of range\n"},
      {With(kCeSpec, "vocab", R"("x")"), "kjit-tune: --spec: vocab: must be a number, got \"x\"\n"},
      {With(kCeSpec, "softcap", "1e39"), "kjit-tune: --spec: softcap: 1e+39 is out of range\n"},
      {With(kCeSpec, "label_smoothing", "0.9999999999"),
       "kjit-tune: --spec: label_smoothing: 0.9999999999 (1 as a float) must be in [0, 1)\n"},
      {With(kCeSpec, "argmax", "0"), "kjit-tune: --spec: argmax: must be true or false, got 0\n"},
      {With(kRmsSpec, "vocab", "1000"), "kjit-tune: --spec: vocab: is not a field of rms_norm"},
  };
  for (const auto& c : cases) {
    const CliResult r = Run({"--spec", c.spec, "--arch", "sm_90"});
    EXPECT_EQ(r.exit_code, 2) << c.spec << "\n" << r.Describe();
    EXPECT_TRUE(r.err.starts_with(c.message)) << c.spec << "\n" << r.Describe();
  }
  EXPECT_FALSE(fs::exists(root_ + "/cache")) << "nothing was compiled";
}

// Issue 45, defects 11 and 12: what a config.json or a spec holds reaches the terminal escaped,
// and a value echoed in a message is quoted and cut (a NUL cut it; 100 KB came back whole).
TEST_F(KjitTuneTest, WhatTheUserGaveIsEscapedAndCutInWhatItPrints) {
  const std::string path = root_ + "/config.json";
  std::ofstream(path) << R"({"_name_or_path": "evil\u001b]0;title\u0007\u001b[2J",
                             "hidden_size": 256, "vocab_size": 1000})";
  CliResult r = Run({"--config", path, "--arch", "sm_90", "--compile-only"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_FALSE(testing::Contains(r.all(), "\x1b")) << r.Describe();
  EXPECT_TRUE(testing::Contains(r.err, "kjit-tune: evil\\x1b]0;title\\x07\\x1b[2J bf16: "))
      << r.Describe();
  const struct {
    std::string spec, message;
  } cases[] = {
      {With(kCeSpec, "\x1b[2J", "1"), "kjit-tune: --spec: \\x1b[2J: is not a field of"},
      {With(kCeSpec, "reduction", R"("mean\u0000x")"),
       "kjit-tune: --spec: reduction: \"mean\\x00x\" is not none, sum or mean\n"},
      {With(kCeSpec, "reduction", "\"" + std::string(100000, 'm') + "\""),
       "kjit-tune: --spec: reduction: \"" + std::string(64, 'm') +
           "...\" (100000 bytes) is not none, sum or mean\n"},
      {With(kCeSpec, "op", R"("\u001b[2J")"), "kjit-tune: --spec: op: \"\\x1b[2J\" is not one of"},
      {With(kCeSpec, "dtype", R"("\u001b[2J")"), "kjit-tune: --spec: dtype: \"\\x1b[2J\" is not"},
  };
  for (const auto& c : cases) {
    r = Run({"--spec", c.spec, "--arch", "sm_90"});
    EXPECT_EQ(r.exit_code, 2) << r.Describe();
    EXPECT_TRUE(r.err.starts_with(c.message)) << r.Describe();
    EXPECT_FALSE(testing::Contains(r.all(), "\x1b")) << r.Describe();
    EXPECT_LT(r.all().size(), 2000u) << r.Describe();
  }
}

// Issue 18: failures that kjit-tune shares with kjit (a missing GPU, a target) said "kjit:".
TEST_F(KjitTuneTest, ItsMessagesStartWithItsName) {
  CliResult r = Run({"--model", "llama-3.2-1b", "--device", "0"});
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(r.err.starts_with("kjit-tune: --device 0: no CUDA driver")) << r.Describe();
  r = Run({"--arch", "sm_10"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
  EXPECT_TRUE(r.err.starts_with("kjit-tune: --arch: 'sm_10' is not a target")) << r.Describe();
}

// The isolation the tuner promises, through its real workers: a candidate whose worker aborts and
// one whose worker hangs fail with their reasons, and every other kernel is still built. The
// timeout leaves room for a slow NVRTC compile under a sanitizer on a loaded CI machine.
TEST_F(KjitTuneTest, APlantedCrashOrHangFailsOneCandidateNotTheRun) {
  const std::string crash = "vec=8 threads=128 unroll=1 cluster=0 staged=0";
  const std::string hang = "vec=8 threads=256 unroll=1 cluster=0 staged=0";
  env_["KJIT_TUNE_INJECT_FAULT"] = "crash:" + crash + ";hang:" + hang;
  const CliResult r = Run({"--vocab", "300", "--hidden", "64", "--arch", "sm_90",
                           "--all-candidates", "--timeout", "10", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["ok"], true);
  EXPECT_EQ(report["timed"], false);
  std::map<std::string, std::string> failures;
  for (const auto& f : report["failures"]) failures[f["config"]] = f["error"];
  EXPECT_EQ(failures.size(), 2u) << report["failures"].dump();
  EXPECT_NE(failures[crash].find("crashed: signal 6"), std::string::npos) << failures[crash];
  EXPECT_NE(failures[hang].find("hung: no answer in 10 s"), std::string::npos) << failures[hang];
  EXPECT_EQ(report["kernels"].size(), 4u);
  for (const auto& k : report["kernels"]) EXPECT_EQ(k["origin"], "compiled") << k.dump();
  // Every pruned config carries its reason.
  EXPECT_FALSE(report["pruned"].empty());
  for (const auto& p : report["pruned"]) EXPECT_FALSE(p["reason"].get<std::string>().empty());
}

// Issue 34 (4): integers were read as strtoll's base 0 reads them, "016" as octal 14. They are
// decimal: leading zeros mean nothing.
TEST_F(KjitTuneTest, IntegersAreDecimal) {
  const CliResult r =
      Run({"--spec", kRmsSpec.dump(), "--arch", "sm_90", "--tokens", "016,0", "--json"});
  ASSERT_EQ(r.exit_code, 2) << r.Describe();  // 0 is still 0
  const CliResult ok =
      Run({"--spec", kRmsSpec.dump(), "--arch", "sm_90", "--tokens", "016,00100", "--json"});
  ASSERT_EQ(ok.exit_code, 0) << ok.Describe();
  EXPECT_EQ(nlohmann::json::parse(ok.out)["tokens"], nlohmann::json({16, 100})) << ok.out;
}

// Issue 34 (1): the JSON report to a full stdout aborted (exit 134); a short output (--help) to a
// closed one was lost with exit 0. Both are failures: one line on stderr, exit 1.
TEST_F(KjitTuneTest, OutputThatCannotBeWrittenIsAFailure) {
  const std::vector<std::string> report = {"--spec", kRmsSpec.dump(), "--arch", "sm_90", "--json"};
  CliResult r = Run(report, testing::Stdout::kFull);
  EXPECT_EQ(r.signal, 0) << r.Describe();
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_TRUE(
      r.err.ends_with("\nkjit-tune: cannot write to standard output: No space left on "
                      "device\n"))
      << r.Describe();
  r = Run({"--help"}, testing::Stdout::kClosed);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, "kjit-tune: cannot write to standard output: Bad file descriptor\n")
      << r.Describe();
  r = Run({"--version"}, testing::Stdout::kBrokenPipe);
  EXPECT_EQ(r.exit_code, 1) << r.Describe();
  EXPECT_EQ(r.err, "kjit-tune: cannot write to standard output: Broken pipe\n") << r.Describe();
}

}  // namespace
}  // namespace kjit::tools
