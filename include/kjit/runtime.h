// Runtime: the entry point of kjit's API. It owns the kernel caches (in memory and on disk) and,
// unless it was created compile-only, one GPU's primary context and the target kernels are built
// for. Ops made from it (RmsNorm, CrossEntropy, ShardedCrossEntropy, LinearCrossEntropy) keep it
// alive.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::Runtime rt, kjit::Runtime::Create());       // GPU 0
//   KJIT_ASSIGN_OR_RETURN(kjit::RmsNorm norm, rt.RmsNorm({.hidden = 4096}));
//   // without a GPU, to prebuild a cache:
//   auto rt = kjit::Runtime::Create({.target = "sm_100", .compile_only = true});
//
// Tuner: what a runtime runs when a launch falls in a row bucket its tuning database lacks
// (KJIT_AUTOTUNE). Programs that link kjit get kjit-tune in a child process as the default tuner;
// SetDefaultTuner installs another:
//
//   class MyTuner : public kjit::Tuner {
//     absl::Status Tune(const kjit::TuneRequest& r) override;  // writes r.tuning_db
//   };
//   kjit::SetDefaultTuner(std::make_shared<MyTuner>());
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kjit/device_info.h"
#include "kjit/status.h"

namespace kjit {

class RmsNorm;
class CrossEntropy;
class ShardedCrossEntropy;
class LinearCrossEntropy;
class LogProbs;
struct RmsNormSpec;
struct CrossEntropySpec;
struct ShardedCrossEntropySpec;
struct LinearCrossEntropySpec;
struct LogProbsSpec;

// Receives the library's warnings (an unreadable tuning database, a cache that cannot be written,
// a tuned record that does not fit). The default prints each distinct message once to stderr.
using WarningSink = std::function<void(std::string_view message)>;

struct RuntimeOptions {
  int device = 0;
  // "" picks the device's own arch (CUBIN, or PTX as a fallback); else "sm_90", "compute_90"...
  std::string target;
  // No driver is touched: kernels are compiled and cached but cannot be launched. Needs `target`.
  bool compile_only = false;
  // false: compiled kernels are kept in memory only.
  bool disk_cache = true;
  // The kernel cache directory; "" follows $KJIT_CACHE_DIR, else $XDG_CACHE_HOME/kjit, else
  // ~/.cache/kjit (and $KJIT_CACHE_MAX_BYTES for its size cap).
  std::string cache_dir;
  // Where ops look up tuned configs: "" is $KJIT_TUNING_DB, else tuning.json in the cache
  // directory; "off" uses the heuristics only. A database that cannot be read is reported once
  // through the warning sink and the heuristics are used.
  std::string tuning_db;
  // When a launch's row count falls in a bucket the database has no record for, tune that op,
  // shape and bucket first: the default tuner (DefaultTuner below; by default `kjit-tune --spec` in
  // a child process) runs and the launch waits for it (seconds), once per bucket; never while the
  // stream is capturing a graph. Off by default: a launch never tunes unless asked. KJIT_AUTOTUNE=1
  // turns it on too.
  bool autotune = false;
  // Null: the default sink (stderr, once per message).
  WarningSink warnings;
};

// What a runtime asks its tuner for: one op, at one launch's row count, on its GPU.
struct TuneRequest {
  std::string spec_json;  // the op's spec as `kjit-tune --spec` takes it: {"op": "rms_norm", ...}
  int64_t rows = 0;       // the launch's row count: the tuner tunes its rows bucket
  std::string tuning_db;  // the database to merge the result into; the runtime then reloads it
  int device = 0;         // the runtime's GPU (RuntimeOptions::device)
  WarningSink warnings;   // the runtime's sink (never null), for what the tuner says as it works
};

// Tunes for a runtime's launch (RuntimeOptions::autotune, KJIT_AUTOTUNE). Tune blocks until the
// request's op and bucket are in request.tuning_db, or fails: the runtime warns with the error's
// message and launches untuned. Runtimes call it for one device at a time (their timings would
// disturb each other); it should bound its own wait, as the default tuner does.
class Tuner {
 public:
  virtual ~Tuner() = default;
  virtual absl::Status Tune(const TuneRequest& request) = 0;
};

// The tuner every runtime uses when it autotunes, from the next tuning on; thread-safe. Programs
// that link kjit start with kjit-tune in a child process (kjit_launch_tuner). Null: none,
// and a runtime that should autotune warns once and launches untuned.
void SetDefaultTuner(std::shared_ptr<Tuner> tuner);
std::shared_ptr<Tuner> DefaultTuner();

// What building an op's kernels produced: its cache key, where the binary came from and lies.
// An op may be built as several programs, each its own cache entry (CrossEntropy compiles each
// kernel apart, so that a launch compiles only the kernels it runs): then key, program, path and
// params are its first program's, the rest sums up all of them, and `programs` describes each.
struct BuildInfo {
  std::string key;      // the cache key (a hash of source, options, NVRTC and target)
  std::string program;  // its name: "rms_norm", "cross_entropy.forward_backward"
  std::string target;   // "sm_90"
  // "compiled", "disk cache" or "memory"; of several programs: "compiled" if any was compiled,
  // else "disk cache" if any came from it.
  std::string origin;
  std::string path;   // the disk cache entry; "" when memory-only (when any program is)
  size_t bytes = 0;   // the CUBIN or PTX (all programs')
  std::string nvrtc;  // the NVRTC version that compiled it, "13.0"
  std::map<std::string, std::string> params;  // the op's parameters and config
  std::vector<std::string> kernels;  // the kernels it holds (all programs'), by their mangled names
  std::vector<BuildInfo> programs;   // each program alone (with no programs of its own); one for
                                     // an op built as one program

  // One line of JSON, as the C API's kjit_*_build return it: every field above by its name (keys
  // in alphabetical order), each program as {"bytes", "kernels", "key", "origin", "path",
  // "program"}; a byte that is not UTF-8 (in a path) is written as U+FFFD.
  //
  //   KJIT_ASSIGN_OR_RETURN(kjit::BuildInfo built, norm.Build());
  //   std::string json = built.ToJson();  // {"bytes":9128,"kernels":["_Z..."],"key":"f14a...",...}
  std::string ToJson() const;
};

namespace internal {
struct RuntimeState;
struct RuntimeAccess;
}  // namespace internal

class Runtime {
 public:
  static absl::StatusOr<Runtime> Create(const RuntimeOptions& options = {});
  // Whether this machine has what a runtime needs, without creating one: the CUDA driver (unless
  // `compile_only`), then NVRTC. Unavailable with the loader's message (what is missing and how to
  // fix it) for the first that cannot be used, e.g. "no CUDA driver: libcuda.so.1 could not be
  // loaded (...)\nfix: install the NVIDIA driver; ..."; `kjit doctor` tells more.
  //
  //   KJIT_RETURN_IF_ERROR(kjit::Runtime::CheckToolchain(options.compile_only));
  //   KJIT_ASSIGN_OR_RETURN(kjit::Runtime rt, kjit::Runtime::Create(options));
  static absl::Status CheckToolchain(bool compile_only = false);

  absl::StatusOr<kjit::RmsNorm> RmsNorm(const RmsNormSpec& spec) const;
  absl::StatusOr<kjit::CrossEntropy> CrossEntropy(const CrossEntropySpec& spec) const;
  // Vocab-parallel cross-entropy for one rank's shard (kjit/sharded_cross_entropy.h).
  absl::StatusOr<kjit::ShardedCrossEntropy> ShardedCrossEntropy(
      const ShardedCrossEntropySpec& spec) const;
  // The lm_head and the loss fused (kjit/linear_cross_entropy.h); needs cuBLASLt to launch.
  absl::StatusOr<kjit::LinearCrossEntropy> LinearCrossEntropy(
      const LinearCrossEntropySpec& spec) const;
  // Per-token log-probabilities and entropy with temperature, for RL (kjit/log_probs.h).
  absl::StatusOr<kjit::LogProbs> LogProbs(const LogProbsSpec& spec) const;

  // What kernels are built for: "sm_90", "sm_100a", "compute_90".
  std::string target() const;
  // The compute capability of that target, e.g. 90.
  int arch() const;
  bool compile_only() const;
  // The GPU; empty when compile-only.
  const DeviceInfo& device() const;

 private:
  friend struct internal::RuntimeAccess;
  explicit Runtime(std::shared_ptr<internal::RuntimeState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::RuntimeState> state_;
};

}  // namespace kjit
