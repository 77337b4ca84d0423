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
#include <string>

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
  CliResult Run(const std::vector<std::string>& args) {
    return testing::RunProgram(KJIT_TUNE_PATH, args, env_, root_);
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
  EXPECT_EQ(ops, (std::set<std::string>{"rms_norm", "rms_norm+residual", "cross_entropy"}));
  EXPECT_NE(first.err.find("nothing is timed"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("6 of 6 kernels ready"), std::string::npos) << first.err;

  const CliResult second = Run({"--model", "llama-3.2-1b", "--compile-only", "--json"});
  ASSERT_EQ(second.exit_code, 0) << second.Describe();
  const nlohmann::json again = nlohmann::json::parse(second.out);
  for (const auto& k : again["kernels"]) {
    EXPECT_EQ(k["origin"], "disk cache") << k.dump();
  }
}

TEST_F(KjitTuneTest, ReadsAHuggingFaceConfigFile) {
  const std::string path = root_ + "/config.json";
  std::ofstream(path) << R"({"model_type": "gemma2", "hidden_size": 256, "vocab_size": 1000,
                             "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0})";
  const CliResult r = Run({"--config", path, "--arch", "sm_90", "--json"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  const auto report = nlohmann::json::parse(r.out);
  EXPECT_EQ(report["vocab_size"], 1000);
  EXPECT_EQ(report["kernels"].size(), 3u);
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
  EXPECT_NE(r.err.find("op spec"), std::string::npos) << r.err;
  r = Run({"--spec", spec, "--model", "llama-3.1-8b"});
  EXPECT_EQ(r.exit_code, 2) << r.Describe();
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
  EXPECT_EQ(report["kernels"].size(), 3u);
  for (const auto& k : report["kernels"]) EXPECT_EQ(k["origin"], "compiled") << k.dump();
  // Every pruned config carries its reason.
  EXPECT_FALSE(report["pruned"].empty());
  for (const auto& p : report["pruned"]) EXPECT_FALSE(p["reason"].get<std::string>().empty());
}

}  // namespace
}  // namespace kjit::tools
