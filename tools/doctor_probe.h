// The probe half of `kjit doctor`: gathers DoctorFacts (doctor.h) from the real machine.
//
// Nothing here depends on the process-wide Driver::Get() / Nvrtc::Get() for the facts: the driver
// and NVRTC are loaded from explicit candidates (by default the same ones kjit uses), so a test can
// point a probe at the toolkit's stub libcuda or a missing file. Only the test compiles and
// launches go through the public API (a Runtime, its RmsNorm; Driver::Get() and Nvrtc::Get()),
// since that is the path users take; they run only once the default candidates loaded.
//
//   DoctorFacts facts = GatherFacts({.arch_targets = {"sm_90", "sm_100"}, .fix_cache = true});
//   std::vector<Finding> findings = Diagnose(facts);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kjit/status.h"
#include "tools/doctor.h"

namespace kjit::tools {

struct ProbeOptions {
  std::vector<std::string> arch_targets;  // --arch, each a valid target ("sm_90", "compute_90")
  bool launch = true;                     // test-launch on each GPU present
  bool fix_cache = false;                 // remove stale and corrupt cache entries
};

DoctorFacts GatherFacts(const ProbeOptions& options);

// The parts, for tests.
EnvFacts ProbeEnv();
// Loads libcuda from `candidates` (jit::DefaultDriverCandidates() in production) and lists its
// GPUs; a failure is classified by what cuInit returned. A loaded driver is never unloaded (its
// threads would outlive the code).
DriverFacts ProbeDriver(const std::vector<std::string>& candidates);
NvrtcFacts ProbeNvrtc(const std::vector<std::string>& candidates);
// Opens libcublasLt from `candidates` (ops::CublasLt::DefaultCandidates() in production).
CublasLtFacts ProbeCublasLt(const std::vector<std::string>& candidates);
// Inspects `dir` (empty: where kjit's cache is, from the environment) without creating it.
CacheFacts ProbeCache(const std::string& dir = "");
// Reads the tuning database a runtime created now would read (TuningDb::DefaultPath(), which
// follows KJIT_TUNING_DB and the cache directory), without creating anything.
TuningFacts ProbeTuning();
// What the test launch ran RMSNorm forward (bf16, llama casting, no weight offset) on and what the
// GPU gave back, as the device holds them: x [rows x hidden] and w [hidden] in bf16, y [rows x
// hidden] in bf16, rstd [rows] in fp32.
struct TestLaunchValues {
  int64_t rows = 0;
  int64_t hidden = 0;
  float eps = 1e-6f;
  std::vector<double> x, w, y, rstd;
};
// y and rstd against RMSNorm computed in fp32 here: y within 2^-6 of its size (the two bf16
// roundings of llama casting, either of which a correct kernel may round the other way), rstd
// within 2^-12 (fp32 sums of a row in another order). The worst error as a fraction of its
// tolerance; else Internal "wrong result: y: 12 of 262144 elements differ (first y[17] = 0.5,
// RMSNorm in fp32 gives 0.25)", rstd's likewise (a NaN, an unwritten output, differs).
absl::StatusOr<double> CheckRmsNormInFp32(const TestLaunchValues& run);

// Removes the entries JudgeCacheEntry calls stale or corrupt from facts.cache, records what it did
// in facts.cache.fix and re-reads the cache. An unsafe or read-only cache is not touched.
void FixCache(DoctorFacts& facts);

}  // namespace kjit::tools
