// `kjit doctor`: finds the known ways a GPU set-up fails (no driver in the container, the toolkit's
// stub driver, an NVRTC too old for the GPU, a driver older than NVRTC, an unsafe or stale cache, a
// tuning database the runtime cannot read) and says what to do about each.
//
// Two halves with plain data between them:
//   - the probe (doctor_probe.h) gathers DoctorFacts from the real machine: loads the driver and
//     NVRTC, compiles a real kjit kernel per target, launches it on each GPU, inspects the cache;
//   - Diagnose (here) is a pure function from DoctorFacts to findings, so every failure mode is
//     tested by writing down its facts, without the machine that has it.
//
//   DoctorFacts facts = GatherFacts({.arch_targets = {"sm_100"}});
//   std::vector<Finding> findings = Diagnose(facts);
//   fmt::print("{}", FormatText(findings));
//   return ExitCodeFor(findings);              // 0: nothing failed, 1: something did
//
// Check ids are stable (scripts match on them): "driver", "gpu.<N>", "nvrtc", "target.gpu.<N>",
// "compat.min_driver", "compat.ptx", "compile.<target>" (e.g. "compile.sm_90"), "launch.gpu.<N>",
// "cublaslt", "cache.dir", "cache.permissions", "cache.stale", "cache.corrupt", "cache.fix",
// "tuning", "env". A check whose prerequisite failed (no driver: no gpu.N, compat.*, launch.*; no
// NVRTC: no target.*, compile.*) is left out; the prerequisite's FAIL says why.
//
// `kjit doctor --json` prints, schema 1 (fields are only ever added, never renamed or retyped):
//
//   {
//     "schema": 1,                        // integer; bumped only on an incompatible change
//     "kjit": "0.1.0",                    // kjit's version
//     "findings": [                       // in the order the text report prints them
//       {"check":   "driver",             // a check id as above
//        "status":  "FAIL",               // "OK" | "WARN" | "FAIL"
//        "message": "no CUDA driver: ...",// one line: what was found
//        "fix":     "install ..."}        // one line: what to do; "" when status is "OK"
//     ],
//     "summary": {"ok": 7, "warn": 1, "fail": 1},   // counts of findings by status
//     "exit_code": 1                      // 0 when no finding is FAIL, else 1
//   }
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kjit::tools {

// --- facts
// ----------------------------------------------------------------------------------------

struct GpuFacts {
  int ordinal = 0;
  std::string name;
  int cc_major = 0;
  int cc_minor = 0;
  uint64_t total_memory = 0;  // bytes
  int sm_count = 0;
  int cc() const { return cc_major * 10 + cc_minor; }
};

struct DriverFacts {
  enum class Error {
    kNone,      // loaded, cuInit succeeded
    kMissing,   // no libcuda could be opened
    kStub,      // the toolkit's stubs/libcuda.so: cuInit returned CUDA_ERROR_STUB_LIBRARY (34)
    kNoDevice,  // cuInit returned CUDA_ERROR_NO_DEVICE (100), or no device counted
    kOther,     // anything else (too old, cuInit failed otherwise); see message
  };
  Error error = Error::kNone;
  std::string message;                  // the loader's first line when error != kNone
  std::vector<std::string> candidates;  // what was tried
  std::string path;                     // the library opened (also for kStub / kNoDevice)
  int version = 0;                      // cuDriverGetVersion: 13000 = CUDA 13.0; 0 unknown
  std::string release;                  // the kernel module's version ("580.65.06"), "" unknown
  std::vector<GpuFacts> gpus;
  bool ok() const { return error == Error::kNone; }
};

struct NvrtcFacts {
  bool loaded = false;
  std::string error;  // first line of the load error when !loaded
  std::string path;
  int major = 0;
  int minor = 0;
  std::vector<int> archs;  // nvrtcGetSupportedArchs: {75, 80, ..., 120}
  int version() const { return major * 1000 + minor * 10; }  // the driver's encoding
  std::string VersionString() const;                         // "13.0", as cache entries record it
};

// libcublasLt, which only LinearCrossEntropy (the fused lm_head + loss) needs: its GEMMs.
struct CublasLtFacts {
  bool loaded = false;
  std::string error;  // first line of the load error when !loaded
  std::string path;
  size_t version = 0;  // cublasLtGetVersion: 130100 = 13.1.0
  int cudart = 0;      // the CUDA runtime it was built with, the driver's encoding: 13000
  std::string VersionString() const;  // "13.1.0"
};

// A test compile of the RMSNorm kernel (hidden 4096, bf16) for one target.
struct CompileFacts {
  std::string target;  // "sm_90", "compute_90"
  bool ok = false;
  std::string error;  // first line when !ok
  uint64_t code_bytes = 0;
  double seconds = 0;
};

// A test launch of RMSNorm forward on one GPU, checked against RMSNorm computed in fp32.
struct LaunchFacts {
  // kSkipped: not asked for (--no-launch); kNotAttempted: something it needs failed.
  enum class State { kNotAttempted, kSkipped, kOk, kError };
  int ordinal = 0;
  State state = State::kNotAttempted;
  std::string target;  // what the runtime loaded
  std::string detail;  // the result on success, the error (first line) or why not attempted
};

struct CacheEntryFacts {
  std::string key;
  uint64_t bytes = 0;
  bool valid = false;
  std::string problem;        // why not, when !valid
  std::string target;         // when valid: "sm_90"
  std::string nvrtc_version;  // when valid: "13.0"
};

struct CacheFixFacts {
  bool ran = false;     // --fix-cache was given
  std::string refused;  // why nothing was attempted (unsafe or read-only cache), or ""
  int removed_stale = 0;
  int removed_corrupt = 0;
  std::vector<std::string> errors;  // "key: why" per entry that could not be removed
};

struct CacheFacts {
  std::string dir;           // "" when none can be determined
  std::string dir_source;    // "KJIT_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "passwd"
  std::string config_error;  // e.g. a bad KJIT_CACHE_MAX_BYTES; "" when fine
  uint64_t max_bytes = 0;    // KJIT_CACHE_MAX_BYTES, 0 = no cap
  bool exists = false;
  bool is_dir = false;
  std::string create_error;  // when !exists: why it cannot be created, "" when it can
  // When !exists because dir, or a directory on the way, is a symlink to a missing target:
  // "L is a symlink to 'T', which does not exist" (jit::DescribeDanglingSymlink).
  std::string dangling_symlink;
  uint32_t mode = 0;  // permission bits
  uint32_t owner_uid = 0;
  uint32_t euid = 0;
  bool writable = false;
  std::string not_writable_reason;
  bool listed = false;  // entries were read
  std::vector<CacheEntryFacts> entries;
  CacheFixFacts fix;
};

// What decides whether a tuning record applies on a machine (the rest of its TuningKey, op, dtype,
// shape and rows bucket, only picks among the records that do).
struct TuningRecordFacts {
  std::string device;  // "NVIDIA H200"
  int arch = 0;        // the arch of the target it was tuned with: 90
  int driver = 0;      // cuDriverGetVersion: 13000
  int nvrtc = 0;       // NVRTC major*1000 + minor*10: 13000
  // `rms_norm hidden=4096 bf16 rows<=16: "vec=8 threads=512"`: the record, for messages.
  std::string what;
  // Why a runtime would refuse it at launch (ops::CheckTuningRecords: names no op kjit has, or a
  // config that does not parse or fit its op on its arch), warning and running the heuristic's
  // config instead; "" when it would use it, or when that cannot be told here.
  std::string refused;
};

// The tuning database as a runtime created now would read it: TuningDb::DefaultPath() and
// TuningDb::Load().
struct TuningFacts {
  enum class State {
    kNoPath,      // neither KJIT_TUNING_DB nor a cache directory: the runtime tunes nothing
    kMissing,     // no file yet
    kLoaded,      // read; `records` has one entry per record
    kCorrupt,     // Load said DataLoss: not a valid tuning database
    kNotAFile,    // a directory, FIFO, ...; `what` says which
    kUnreadable,  // cannot be opened or read (permissions, a path through a file); see `error`
  };
  State state = State::kNoPath;
  std::string path;      // as the runtime uses it (relative when KJIT_TUNING_DB or the cache is)
  std::string absolute;  // `path` resolved against doctor's working directory
  std::string what;      // kNotAFile: "a directory", "a FIFO", ...
  std::string error;     // kCorrupt, kUnreadable: what Load said, one line, without path or fix
  std::vector<TuningRecordFacts> records;
};

struct EnvFacts {
  std::map<std::string, std::string> kjit_vars;     // every KJIT_* variable set
  std::optional<std::string> cuda_visible_devices;  // nullopt: unset
  std::string ld_library_path;
  bool in_container = false;
  std::string container_hint;           // "/.dockerenv", "cgroup: docker", ...
  std::vector<std::string> dev_nvidia;  // /dev/nvidia* present ("nvidia0", ...)
};

struct DoctorFacts {
  std::string kjit_version;  // "0.1.0"
  DriverFacts driver;
  NvrtcFacts nvrtc;
  std::vector<std::string> arch_targets;  // --arch, already validated
  std::vector<CompileFacts> compiles;
  std::vector<LaunchFacts> launches;
  CublasLtFacts cublaslt;
  CacheFacts cache;
  TuningFacts tuning;
  EnvFacts env;
};

// --- findings
// -------------------------------------------------------------------------------------

enum class Status { kOk, kWarn, kFail };
const char* StatusName(Status s);  // "OK", "WARN", "FAIL"

struct Finding {
  std::string check;
  Status status = Status::kOk;
  std::string message;  // one line
  std::string fix;      // one line; non-empty for WARN and FAIL
};

std::vector<Finding> Diagnose(const DoctorFacts& facts);

// 0 when no finding is FAIL, else 1.
int ExitCodeFor(const std::vector<Finding>& findings);

// "[ OK ] check: message" per finding, "       fix: ..." under WARN/FAIL, then a summary line.
std::string FormatText(const std::vector<Finding>& findings);
// The JSON document described at the top of this file.
std::string FormatJson(const std::vector<Finding>& findings, const std::string& kjit_version);

// --- shared by the probe and Diagnose
// ----------------------------------------------------------------

// "13.0" for 13000 (the driver's version encoding).
std::string CudaVersionText(int version);
// The oldest Linux driver release for a CUDA major version: "580.65.06" for 13, "525.60.13" for
// 12; "" when unknown.
std::string MinimumDriverForCudaMajor(int major);
// The first CUDA version whose NVRTC builds for `cc`: "12.8" for 100 and 120; "" when unknown.
std::string FirstCudaForArch(int cc);

// The targets kjit compiles for here: each GPU's selected target (CUBIN for its arch, or PTX
// fallback), then the --arch targets; the default prebuild targets (sm_90, sm_100) when there is no
// GPU and no --arch. Without NVRTC, GPUs contribute nothing. Deduplicated, in order.
std::vector<std::string> TargetsInUse(const DoctorFacts& facts);

enum class EntryVerdict { kUsable, kStaleTarget, kStaleNvrtc, kCorrupt };
// Why a cache entry is or is not usable here: corrupt (fails its checks), built for a target
// nothing here uses, or by another NVRTC (its key can never match). An unknown NVRTC (not loaded)
// judges no entry stale by version.
EntryVerdict JudgeCacheEntry(const CacheEntryFacts& entry, const DoctorFacts& facts);

}  // namespace kjit::tools
