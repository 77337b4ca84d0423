// The autotuner: for each op of a model, every candidate config of its search space is compiled in
// worker processes, `jobs` at a time; on a GPU each is then checked against the fp64 reference and
// timed at each row count in a GPU worker (one at a time, so timings do not disturb each other);
// the fastest per (op, shape, row bucket) goes to the tuning database, where the ops find it.
// Without a GPU only the heuristic configs (with all_candidates, the whole space) are compiled, so
// the cache is warm, and the report says nothing was timed.
//
// Keys already in the database are not tuned again (unless retune): a second run only makes sure
// their kernels are in the cache.
//
//   TunePlan plan{.ops = {RmsNormSpec{.hidden = 4096}, CrossEntropySpec{.vocab = 128256}},
//                 .tokens = {1024, 4096, 16384}, .gpu = &rt, .targets = {&rt},
//                 .worker_command = {"/proc/self/exe", "--worker"}};
//   nlohmann::json report = Tune(plan, {});
//   bool ok = report["ok"];
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "autotune/tune_task.h"

namespace kjit::autotune {

struct TunePlan {
  std::vector<OpSpec> ops;              // their configs unset
  std::vector<int64_t> tokens;          // row counts to tune at (on a GPU)
  const Runtime* gpu = nullptr;         // time on it; null: compile only
  std::vector<const Runtime*> targets;  // compile for each (the GPU's runtime among them)
  bool all_candidates = false;          // compile the whole search space even without timing
  bool retune = false;                  // tune keys the database already has
  int jobs = 1;                         // compile workers at once
  int repeats = 20;                     // timed repeats per candidate
  std::chrono::milliseconds task_timeout{std::chrono::seconds(120)};
  std::vector<std::string> worker_command;  // argv of a worker (RunTuneWorker)
  std::string db_path;                      // the tuning database to read and update
};

struct TuneProgress {
  std::function<void(const std::string& phase, size_t tasks)> phase;  // a phase starts
  std::function<void(const std::string& what, bool failed)> step;     // one task finished
};

// The report: {"ok", "timed", "stored", "copy_gbps", "kernels": [...], "pruned": [...],
// "failures": [...], "database": {...}}; each kernel entry says its op, shape, target, config,
// whether it was tuned (and then its rows, times, the heuristic's time, the runner-up and margin),
// where it came from and whether it is "stored" in the kernel cache. "ok" is false when a
// heuristic config failed to build, a key could not be tuned, or, without a GPU (prebuilding is
// then the point), a kernel could not be stored (a read-only cache): a "store" failure. Every
// string in it is valid UTF-8 (paths are not always), so a plain dump() of it does not throw.
nlohmann::json Tune(const TunePlan& plan, const TuneProgress& progress);

}  // namespace kjit::autotune
