#include "jit/jit.h"

#include <algorithm>
#include <atomic>
#include <system_error>
#include <thread>

#include <fmt/format.h>

#include "jit/cache_key.h"
#include "jit/compiler.h"
#include "jit/exit_gate.h"
#include "jit/glibc_compat.h"
#include "jit/status_helpers.h"
#include "jit/trace.h"
#include "jit/warnings.h"

namespace kjit::jit {

const char* OriginName(Jit::Origin origin) {
  switch (origin) {
    case Jit::Origin::kMemory: return "memory";
    case Jit::Origin::kDisk: return "disk cache";
    case Jit::Origin::kCompiled: return "compiled";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<Jit>> Jit::Create(const Options& options) {
  std::unique_ptr<Jit> jit(new Jit(options));
  if (options.use_disk_cache) {
    DiskCache::Options cache_options;
    if (options.cache) {
      cache_options = *options.cache;
    } else {
      KJIT_ASSIGN_OR_RETURN(cache_options, DiskCache::Options::FromEnvironment());
    }
    KJIT_ASSIGN_OR_RETURN(DiskCache disk, DiskCache::Open(cache_options));
    if (!disk.warning().empty()) jit->Warn(disk.warning());
    jit->disk_ = std::move(disk);
  }
  return jit;
}

void Jit::Warn(std::string_view message) const {
  if (options_.warn) {
    options_.warn(message);
  } else {
    WarnOnceToStderr(message);
  }
}

int Jit::compile_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return compiles_;
}

absl::StatusOr<Jit::Built> Jit::Build(const Source& source, const Target& target) {
  KJIT_ASSIGN_OR_RETURN(const Nvrtc* nvrtc, Nvrtc::Get());
  Built built;
  built.key = CacheKey(source, target, CompileOptions(target), nvrtc->version().ToString());
  TraceSpan span("build " + source.name, "jit");
  if (Tracer::Global().enabled()) {
    span.AddArg("target", target.ToString());
    span.AddArg("key", built.key);
    span.AddArg("params", FormatParams(source.params));
  }
  std::unique_lock<std::mutex> lock(mu_);
  built_cv_.wait(lock, [&] { return building_.count(built.key) == 0; });
  if (auto it = built_.find(built.key); it != built_.end()) {
    Built hit = it->second;
    hit.origin = Origin::kMemory;
    span.AddArg("origin", OriginName(hit.origin));
    return hit;
  }
  const std::string key = built.key;
  building_.insert(key);
  lock.unlock();
  absl::StatusOr<Built> result = BuildUncached(source, target, *nvrtc, std::move(built));
  lock.lock();
  if (result.ok()) {
    span.AddArg("origin", OriginName(result->origin));
    built_[key] = *result;
    if (result->origin == Origin::kCompiled) ++compiles_;
  }
  building_.erase(key);
  built_cv_.notify_all();
  return result;
}

absl::StatusOr<std::vector<Jit::Built>> Jit::BuildAll(const std::vector<Source>& sources,
                                                      const Target& target) {
  std::vector<absl::StatusOr<Built>> results(sources.size(),
                                             absl::InternalError("BuildAll: not built"));
  // One worker a core, each taking the next program in turn: on few cores a launch's longest
  // program keeps a core to itself instead of being time-sliced with all the others.
  std::atomic<size_t> next{0};
  // The workers' passes are this call's (exit waits for them through it, and none parks a worker
  // that the call is about to join).
  const bool held = ExitGate::held();
  auto work = [&] {
    ExitGate::Inherited inherited(held);
    for (size_t i; (i = next++) < sources.size();) results[i] = Build(sources[i], target);
  };
  const size_t workers =
      std::min<size_t>(sources.size(), std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> threads;
  for (size_t w = 1; w < workers; ++w) {
    try {
      threads.emplace_back(work);
    } catch (const std::system_error&) {  // no more threads to be had: those there share the work
      break;
    }
  }
  work();
  for (std::thread& t : threads) t.join();
  std::vector<Built> built;
  for (absl::StatusOr<Built>& r : results) {
    if (!r.ok()) return r.status();
    built.push_back(std::move(*r));
  }
  return built;
}

absl::StatusOr<Jit::Built> Jit::BuildUncached(const Source& source, const Target& target,
                                              const Nvrtc& nvrtc, Built built) {
  auto remember = [&](Binary bin, Origin origin, bool on_disk) {
    built.binary = std::make_shared<const Binary>(std::move(bin));
    built.origin = origin;
    if (on_disk) built.path = disk_->dir() + "/" + built.key + ".kjit";
    return built;
  };
  auto compile = [&]() -> absl::StatusOr<Binary> {
    TraceSpan compiling("nvrtc " + source.name, "jit", {{"target", target.ToString()}});
    return Compile(nvrtc, source, target);
  };
  if (!disk_) {
    KJIT_ASSIGN_OR_RETURN(Binary bin, compile());
    return remember(std::move(bin), Origin::kCompiled, false);
  }
  if (std::optional<Binary> hit = disk_->Lookup(built.key)) {
    return remember(std::move(*hit), Origin::kDisk, true);
  }
  // Hold the key's lock while compiling so that other processes wait for our entry instead of
  // compiling the same kernel; past the timeout (a hung peer, a slow shared filesystem) compile
  // anyway.
  std::optional<DiskCache::KeyLock> key_lock;
  if (!disk_->read_only()) {
    auto locked = disk_->LockKey(built.key, options_.lock_timeout);
    if (locked.ok()) {
      key_lock.emplace(std::move(*locked));
      if (std::optional<Binary> hit = disk_->Lookup(built.key)) {
        return remember(std::move(*hit), Origin::kDisk, true);
      }
    } else {
      Warn(fmt::format("{}; compiling without the lock", ToStd(locked.status().message())));
    }
  }
  KJIT_ASSIGN_OR_RETURN(Binary bin, compile());
  bool stored = false;
  if (!disk_->read_only()) {
    absl::Status s = disk_->Store(built.key, bin);
    stored = s.ok();
    if (!stored) {
      Warn(fmt::format("could not store {} in the cache ({}); keeping it in memory", built.key,
                       ToStd(s.message())));
    }
  }
  return remember(std::move(bin), Origin::kCompiled, stored);
}

absl::StatusOr<std::shared_ptr<const LoadedModule>> Jit::Load(const Source& source,
                                                              const Target& target,
                                                              const Driver& cu, CUcontext ctx) {
  KJIT_ASSIGN_OR_RETURN(Built built, Build(source, target));
  std::lock_guard<std::mutex> lock(mu_);
  auto slot = std::make_pair(built.key, ctx);
  if (auto it = modules_.find(slot); it != modules_.end()) return it->second;
  TraceSpan loading("load " + source.name, "jit", {{"key", built.key}});
  KJIT_ASSIGN_OR_RETURN(std::shared_ptr<LoadedModule> module,
                        LoadedModule::Load(cu, *built.binary, ctx));
  modules_[slot] = module;
  return std::shared_ptr<const LoadedModule>(module);
}

}  // namespace kjit::jit
