// Chrome trace-event recording of kjit's work (compiles, cache hits and misses, module loads and,
// when asked, kernel launches) for Perfetto and chrome://tracing. KJIT_TRACE=file.json turns it on;
// KJIT_TRACE_LAUNCHES=1 adds launches; KJIT_TRACE_MAX_EVENTS caps the events kept (default 100000;
// the rest are counted as dropped in the file). The file is written once: at exit, or at the first
// Flush(); later events are counted as dropped and no second write happens. KJIT_TRACE may name a
// FIFO or a character device: it is written into, not replaced.
//
// Several processes may share one KJIT_TRACE (kjit-tune's workers, the ranks of a training job):
// a regular file collects them all. Each process, under an flock on the file, reads the kjit
// trace already there, adds its own events (each carries its pid: one track per process) and
// replaces the file through a rename. A file that is not a kjit trace is replaced. So events add
// up across runs too: remove the file to start afresh, as `kjit --trace` and `kjit-tune --trace`
// do before they start.
//
//   {
//     kjit::jit::TraceSpan span("compile", "jit", {{"target", "sm_90"}});   // one "X" event
//     ...
//   }
//   KJIT_RETURN_IF_ERROR(kjit::jit::Tracer::Global().Flush());
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kjit/status.h"

namespace kjit::jit {

using TraceArgs = std::vector<std::pair<std::string, std::string>>;

class Tracer {
 public:
  // The process's tracer, configured from the environment at first use; flushed at exit.
  static Tracer& Global();
  // A tracer writing to `path` ("" records nothing); for tests and tools.
  Tracer(std::string path, bool launches, size_t max_events);

  bool enabled() const { return !path_.empty(); }
  bool launches() const { return enabled() && launches_; }
  const std::string& path() const { return path_; }

  // A complete event: `name` ran from start_us for dur_us (NowUs() clock).
  void Complete(std::string_view name, std::string_view category, int64_t start_us, int64_t dur_us,
                TraceArgs args);
  // A point in time.
  void Instant(std::string_view name, std::string_view category, TraceArgs args);
  // Writes the file, once only: later calls return OK. A regular file (or a new one) gets these
  // events added to the kjit trace it holds (see above), through a temporary and a rename; a FIFO
  // or a character device is written into, and a FIFO that nobody reads yet is an error, not a
  // wait.
  absl::Status Flush();

  static int64_t NowUs();

 private:
  struct Event {
    std::string name, category;
    char phase;
    int64_t ts_us, dur_us;
    uint64_t tid;
    TraceArgs args;
  };
  void Add(Event e);

  const std::string path_;
  const bool launches_;
  const size_t max_events_;
  std::mutex mu_;
  std::vector<Event> events_;
  size_t dropped_ = 0;
  bool flushed_ = false;
};

// `--trace FILE` of kjit's programs (kjit, kjit-tune, finetune_step): the trace starts afresh (a
// regular file at `path` is removed, as the tracer adds to the kjit trace a file holds; a link such
// as /dev/stdout never is) and KJIT_TRACE names it for this process and the ones it starts. Call it
// before anything traces: the tracer reads the environment once.
void StartTraceFile(const std::string& path);

// An NVTX range in kjit's domain, so that Nsight Systems shows kjit's work by name. NVTX3 is
// header-only and costs a pointer check when no tool is attached.
class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name);
  ~NvtxRange();
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

// Records one complete event on the global tracer from construction to destruction (free when
// tracing is off), inside an NvtxRange of the same name.
class TraceSpan {
 public:
  TraceSpan(std::string_view name, std::string_view category, TraceArgs args = {});
  ~TraceSpan();
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;
  void AddArg(std::string key, std::string value);

 private:
  Tracer& tracer_;
  std::string name_, category_;
  NvtxRange nvtx_;
  TraceArgs args_;
  int64_t start_us_ = 0;
};

}  // namespace kjit::jit
