// Internal: what every op keeps of the kernels it has loaded. A program is loaded once per launch
// config (the config of each tuned row bucket, narrower vectors for views whose alignment does not
// allow the widest; cross-entropy's key adds the launch, whose kernels are programs of their own),
// so a launch after the first touches neither the JIT nor the disk.
//
//   OpKernels<RmsNormConfig, RmsNormKernels> kernels;
//   KJIT_ASSIGN_OR_RETURN(const RmsNormKernels* k, kernels.Get(
//       [&] { return ConfigFor(rows, vec); },               // runs under the cache's lock
//       [&](const RmsNormConfig& c) { return Load(c); }));  // only for a new config
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "jit/loaded_module.h"
#include "jit/source.h"
#include "runtime/runtime_state.h"

namespace kjit::internal {

// A rendered program loaded into the runtime's context, with its kernels in the order of the
// source's name expressions.
struct LoadedProgram {
  std::shared_ptr<const jit::LoadedModule> module;
  std::vector<CUfunction> functions;
};
absl::StatusOr<LoadedProgram> LoadProgram(const RuntimeState& rt, const jit::Source& source);
// The same for another target than the runtime's own, e.g. sm_90a for a kernel that needs the
// arch-specific instructions (wgmma, setmaxnreg) on an sm_90 device.
absl::StatusOr<LoadedProgram> LoadProgram(const RuntimeState& rt, const jit::Source& source,
                                          const jit::Target& target);
// Programs a launch needs together, in `sources`' order: those not cached yet are compiled in
// parallel (jit::Jit::BuildAll) before they are loaded.
absl::StatusOr<std::vector<LoadedProgram>> LoadPrograms(const RuntimeState& rt,
                                                        const std::vector<jit::Source>& sources);

template <typename Config, typename Kernels>
class OpKernels {
 public:
  // The kernels for the config `choose()` returns, loaded by `load(config)` the first time. Both
  // run under the cache's lock: a tuned-config lookup may tune first and is not thread-safe.
  template <typename Choose, typename Load>
  absl::StatusOr<const Kernels*> Get(Choose&& choose, Load&& load) {
    std::lock_guard<std::mutex> lock(mu_);
    const Config config = choose();
    std::string key = config.ToString();
    if (auto it = loaded_.find(key); it != loaded_.end()) return &it->second;
    absl::StatusOr<Kernels> kernels = load(config);
    if (!kernels.ok()) return kernels.status();
    return &loaded_.emplace(std::move(key), std::move(*kernels)).first->second;
  }

  // Runs `f` under the cache's lock, for config queries that share the lookups above.
  template <typename F>
  auto Locked(F&& f) {
    std::lock_guard<std::mutex> lock(mu_);
    return f();
  }

 private:
  std::mutex mu_;
  std::map<std::string, Kernels> loaded_;
};

}  // namespace kjit::internal
