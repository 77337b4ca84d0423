// Jit: the pipeline with its caches, Source -> Binary -> LoadedModule.
//
// In front sits an in-memory registry (a second request in the process touches neither disk nor
// NVRTC), then the disk cache (a request in a new process loads the stored binary), then NVRTC. A
// per-key disk lock makes concurrent processes compile a kernel once; a process that cannot get the
// lock in time compiles on its own. A cache that cannot be written leaves the binary in memory.
//
//   KJIT_ASSIGN_OR_RETURN(auto jit, Jit::Create({}));
//   KJIT_ASSIGN_OR_RETURN(Jit::Built built, jit->Build(source, target));      // no GPU needed
//   KJIT_ASSIGN_OR_RETURN(auto both, jit->BuildAll({a, b}, target));         // in parallel
//   KJIT_ASSIGN_OR_RETURN(auto module, jit->Load(source, target, *driver, ctx));
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "jit/binary.h"
#include "jit/disk_cache.h"
#include "jit/driver.h"
#include "jit/loaded_module.h"
#include "jit/nvrtc.h"
#include "jit/source.h"
#include "jit/target.h"

namespace kjit::jit {

class Jit {
 public:
  struct Options {
    bool use_disk_cache = true;
    std::optional<DiskCache::Options> cache;  // nullopt: DiskCache::Options::FromEnvironment()
    std::chrono::milliseconds lock_timeout{std::chrono::seconds(120)};
    // Where warnings go (a cache that cannot be written, a lock not got in time); null:
    // jit/warnings.h's default sink.
    std::function<void(std::string_view)> warn;
  };

  enum class Origin { kMemory, kDisk, kCompiled };
  struct Built {
    std::shared_ptr<const Binary> binary;
    std::string key;
    Origin origin = Origin::kCompiled;
    std::string path;  // the disk entry, empty when memory-only
  };

  // Fails only for an unusable cache configuration (e.g. an others-writable cache directory);
  // NVRTC is loaded on the first compile.
  static absl::StatusOr<std::unique_ptr<Jit>> Create(const Options& options);

  // Thread-safe; different kernels build in parallel, and a kernel another thread is building is
  // waited for rather than compiled twice.
  absl::StatusOr<Built> Build(const Source& source, const Target& target);
  // Builds several programs at once, on as many threads as there are cores (the caller's one of
  // them), which take the programs in order: NVRTC compiles independent programs in parallel, so
  // programs a launch needs together cost about the slowest of them, not their sum; put that one
  // first (started first, it is not held up by the others: on 2 cores a 0.22 s program with a
  // 0.1 s one after it took 0.22 s, in the other order 0.24). The results are in `sources`'
  // order; on failure, the first failed program's error.
  absl::StatusOr<std::vector<Built>> BuildAll(const std::vector<Source>& sources,
                                              const Target& target);
  absl::StatusOr<std::shared_ptr<const LoadedModule>> Load(const Source& source,
                                                           const Target& target, const Driver& cu,
                                                           CUcontext ctx);

  // nullptr when the disk cache is off.
  const DiskCache* disk_cache() const { return disk_ ? &*disk_ : nullptr; }
  // How many NVRTC compiles this Jit ran; tests use it to prove cache hits.
  int compile_count() const;

 private:
  explicit Jit(const Options& options) : options_(options) {}
  void Warn(std::string_view message) const;
  // The disk cache, else NVRTC (storing the result); called with `key` marked as building.
  absl::StatusOr<Built> BuildUncached(const Source& source, const Target& target,
                                      const Nvrtc& nvrtc, Built built);

  Options options_;
  std::optional<DiskCache> disk_;
  mutable std::mutex mu_;
  std::condition_variable built_cv_;    // signalled when a key leaves building_
  std::set<std::string> building_;      // keys some thread is building now
  std::map<std::string, Built> built_;  // key -> what the first request got (binary, disk path)
  std::map<std::pair<std::string, CUcontext>, std::shared_ptr<const LoadedModule>> modules_;
  int compiles_ = 0;
};

const char* OriginName(Jit::Origin origin);

}  // namespace kjit::jit
