// The probe half of `kjit doctor`: gathers DoctorFacts (doctor.h) from the real machine.
//
// Nothing here depends on the process-wide Driver::Get() / Nvrtc::Get() for the facts: the driver
// and NVRTC are loaded from explicit candidates (by default the same ones kjit uses), so a test can
// point a probe at the toolkit's stub libcuda or a missing file. Only the test launch goes through
// a real Runtime (Driver::Get()), since that is the path users take.
//
//   DoctorFacts facts = GatherFacts({.arch_targets = {"sm_90", "sm_100"}, .fix_cache = true});
//   std::vector<Finding> findings = Diagnose(facts);
#pragma once

#include <string>
#include <vector>

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
// Removes the entries JudgeCacheEntry calls stale or corrupt from facts.cache, records what it did
// in facts.cache.fix and re-reads the cache. An unsafe or read-only cache is not touched.
void FixCache(DoctorFacts& facts);

}  // namespace kjit::tools
