// RunInWorkers: runs tasks in child processes (Boost.Process), so that a task that crashes its
// process, hangs, or leaves its CUDA context broken by a GPU fault costs that process, not the run.
// The autotuner compiles candidates `jobs` at a time this way, and checks and times them in one
// GPU worker at a time.
//
// Protocol: a worker is started as `command` with a request on stdin, {"tasks": [...]}: a batch of
// tasks, each a JSON value. It answers on stdout with one JSON object per line: {"begin": i}
// before task i of its batch, then {"end": i, "result": ...}. Other lines are ignored; stderr goes
// to a log whose tail is attached to a failure. A worker that dies or goes silent past the timeout
// fails the task it had begun; the tasks of its batch it had not begun go to a new worker.
// Requests, answers and logs live in $TMPDIR/kjit-workers-XXXXXX, removed when the pool ends; the
// next pool removes those that killed runs left (their owner's flock on it is gone).
//
//   std::vector<TaskOutcome> out = RunInWorkers(tasks, {.command = {"/proc/self/exe", "--worker"},
//                                                       .jobs = 16});
//   if (!out[0].answered) fmt::print("{}\n{}", out[0].failure, out[0].log);
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace kjit::autotune {

struct TaskOutcome {
  bool answered = false;  // the worker sent an "end" for the task (its result may report an error)
  std::string result;     // that answer's "result", as JSON text
  // Why there is no answer: "crashed: signal 11 (Segmentation fault)", "hung: no answer in 30 s",
  // "worker exited with status 3 before answering", "could not start the worker: ...".
  std::string failure;
  std::string log;  // the tail of the worker's stderr, when it failed
};

struct WorkerPoolOptions {
  std::vector<std::string> command;  // argv of a worker
  int jobs = 1;                      // workers at once
  int batch = 1;                     // tasks sent to one worker
  // A worker that writes no line for this long is killed and its current task fails as hung.
  std::chrono::milliseconds task_timeout{std::chrono::seconds(60)};
  // Called on the calling thread as each task finishes, in completion order.
  std::function<void(size_t index, const TaskOutcome&)> on_done;
};

// tasks: JSON texts (one that does not parse reaches the worker as a discarded value, which it
// should answer with an error). Returns one outcome per task, in the tasks' order.
std::vector<TaskOutcome> RunInWorkers(const std::vector<std::string>& tasks,
                                      const WorkerPoolOptions& options);

}  // namespace kjit::autotune
