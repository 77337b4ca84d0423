// The autotuner's worker process: the other end of RunInWorkers (autotune/worker_pool.h). It reads
// {"tasks": [TuneTask...]} and, for each, prints {"begin": i}, compiles the candidate or checks and
// times it on GPU `device`, and prints {"end": i, "result": TuneAnswer}. `kjit-tune --worker` runs
// it.
//
// Consecutive time tasks of one op, shape and row count share a trial (the inputs on the GPU), so
// the tuner sends them in that order. After a task leaves the CUDA context unusable (a GPU fault is
// sticky) the worker answers it and exits with kContextLost, and the pool starts a fresh one.
//
// For tests of that isolation, KJIT_TUNE_INJECT_FAULT="crash:<config>", "hang:<config>" or
// "gpu-fault:<config>" (several separated by ";") makes the task of that candidate config abort,
// hang, or write through a wild pointer on the GPU instead of running.
//
//   return RunTuneWorker(std::cin, std::cout, /*device=*/0);
#pragma once

#include <istream>
#include <ostream>

namespace kjit::autotune {

constexpr int kContextLost = 3;

int RunTuneWorker(std::istream& in, std::ostream& out, int device);

}  // namespace kjit::autotune
