// Runtime: the entry point of kjit's public API. It owns the JIT (memory and disk caches, NVRTC)
// and, unless it was created compile-only, one GPU's primary context and the target for it.
//
//   KJIT_ASSIGN_OR_RETURN(kjit::Runtime rt, kjit::Runtime::Create());       // device 0
//   KJIT_ASSIGN_OR_RETURN(kjit::RmsNorm norm, rt.RmsNorm({.hidden = 4096}));
//   // without a GPU, to prebuild a cache:
//   auto rt = kjit::Runtime::Create({.target = "sm_100", .compile_only = true});
#pragma once

#include <memory>
#include <string>

#include "jit/driver.h"
#include "jit/jit.h"
#include "jit/status.h"
#include "jit/target.h"
#include "autotune/tuning_db.h"
#include "runtime/cross_entropy.h"
#include "runtime/rms_norm.h"
#include "runtime/sharded_cross_entropy.h"

namespace kjit {

struct RuntimeOptions {
  int device = 0;
  // "" picks the device's own arch (CUBIN, or PTX as a fallback); else "sm_90", "compute_90"...
  std::string target;
  // No driver is touched: kernels are compiled and cached but cannot be launched. Needs `target`.
  bool compile_only = false;
  jit::Jit::Options jit;
  // Where ops look up tuned configs (autotune/tuning_db.h): "" is TuningDb::DefaultPath()
  // ($KJIT_TUNING_DB, else tuning.json in the cache directory); "off" uses the heuristics only.
  // A database that cannot be read is reported once on stderr and the heuristics are used.
  std::string tuning_db;
  // When a launch's row count falls in a bucket the database has no record for, tune that op,
  // shape and bucket first: `kjit-tune --spec` runs in a child process ($KJIT_TUNE_BIN, else
  // kjit-tune on PATH) and the launch waits for it (seconds), once per bucket; never while the
  // stream is capturing a graph. Off by default: a launch never tunes unless asked. KJIT_AUTOTUNE=1
  // turns it on too.
  bool autotune = false;
};

namespace internal { struct RuntimeState; }

class Runtime {
 public:
  static absl::StatusOr<Runtime> Create(const RuntimeOptions& options = {});

  absl::StatusOr<kjit::RmsNorm> RmsNorm(const RmsNormSpec& spec) const;
  absl::StatusOr<kjit::CrossEntropy> CrossEntropy(const CrossEntropySpec& spec) const;
  // Vocab-parallel cross-entropy for one rank's shard (runtime/sharded_cross_entropy.h).
  absl::StatusOr<kjit::ShardedCrossEntropy> ShardedCrossEntropy(
      const ShardedCrossEntropySpec& spec) const;

  const jit::Target& target() const;
  bool compile_only() const;
  // Empty when compile-only.
  const jit::DeviceInfo& device() const;
  jit::Jit& jit() const;
  // The driver and context kernels launch in; null when compile-only.
  const jit::Driver* driver() const;
  CUcontext context() const;
  // The tuning database ops consult; null when off, empty, or unreadable.
  std::shared_ptr<const autotune::TuningDb> tuning_db() const;

  // Internal: what the ops and the tuning keys share.
  const internal::RuntimeState& state() const { return *state_; }

 private:
  explicit Runtime(std::shared_ptr<internal::RuntimeState> state) : state_(std::move(state)) {}
  std::shared_ptr<internal::RuntimeState> state_;
};

}  // namespace kjit
