// What the autotuner hands its worker processes, as JSON: compile one candidate config of an op
// for a target, or check and time it on the GPU at a row count; and what a worker answers.
//
//   TuneTask t{.mode = TuneTask::Mode::kTime, .op = CrossEntropySpec{.vocab = 128256},
//              .config = "vec=8 threads=512 unroll=4 cluster=4 staged=0", .rows = 4096,
//              .pass = Pass::kForwardBackward, .repeats = 20};
//   std::string line = t.ToJson();   // a worker reads it back with TuneTask::FromJson
#pragma once

#include <cstdint>
#include <string>
#include <variant>

#include "autotune/gpu_timer.h"
#include "ops/registry.h"

namespace kjit::autotune {

using ops::OpSpec;
using ops::Pass;

struct TuneTask {
  // kCopy times a device-to-device copy: the bandwidth the tuned kernels are quoted against.
  enum class Mode { kCompile, kTime, kCopy };
  Mode mode = Mode::kCompile;
  OpSpec op;
  std::string config;  // the candidate, as its ToString()
  std::string target;  // kCompile: "sm_90"
  int64_t rows = 0;    // kTime
  Pass pass = Pass::kForwardBackward;
  int repeats = 20;

  std::string ToJson() const;
  // InvalidArgument naming the field for anything the tuner would not have written.
  static absl::StatusOr<TuneTask> FromJson(std::string_view text);
};

// A worker's answer to one task.
struct TuneAnswer {
  std::string error;  // empty on success; a compile log or the check's mismatches otherwise
  // kCompile
  std::string key;     // the program's cache key
  std::string origin;  // jit::OriginName: "compiled", "disk cache", ...
  std::string path;    // the cache entry ("" when the cache is memory-only)
  double compile_ms = 0;
  // kTime
  Timing timing;
  double bytes = 0;  // the fewest bytes the pass moves

  std::string ToJson() const;
  static absl::StatusOr<TuneAnswer> FromJson(std::string_view text);
};

}  // namespace kjit::autotune
