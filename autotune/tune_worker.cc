#include "autotune/tune_worker.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/tune_task.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"
#include "runtime/runtime_state.h"

namespace kjit::autotune {

namespace {

// GPU time a candidate's timed repeats may take (GpuTimer::Time's budget): the cross-entropy and
// RMSNorm candidates (at most ~2 ms a launch) run all their repeats within it; the fused lm_head's
// (20-80 ms) stop after 5-12.
constexpr double kCandidateBudgetUs = 250e3;

// KJIT_TUNE_INJECT_FAULT: what to do instead of the task of a candidate config, as
// "kind:config" entries separated by ';'.
void MaybeInjectFault(const Runtime* gpu, const TuneTask& task) {
  const char* env = std::getenv("KJIT_TUNE_INJECT_FAULT");
  if (env == nullptr) return;
  for (std::string_view rest = env; !rest.empty();) {
    const std::string_view entry = rest.substr(0, rest.find(';'));
    rest.remove_prefix(std::min(rest.size(), entry.size() + 1));
    const size_t colon = entry.find(':');
    if (colon == std::string_view::npos || entry.substr(colon + 1) != task.config) continue;
    const std::string_view kind = entry.substr(0, colon);
    if (kind == "crash") std::abort();
    if (kind == "hang") {
      for (;;) ::pause();
    }
    if (kind == "gpu-fault" && gpu != nullptr) {
      // A write through an address nothing maps: the context reports an illegal address from now
      // on, as after a real out-of-bounds kernel.
      (void)ops::RandomFill(*gpu, reinterpret_cast<void*>(uintptr_t{1} << 40), DType::kF32, 1024,
                            1024, 1024, 1, 0.0f, 1.0f);
    }
  }
}

class Worker {
 public:
  explicit Worker(int device) : device_(device) {}

  TuneAnswer Run(const TuneTask& task) {
    TuneAnswer a;
    absl::Status s;
    switch (task.mode) {
      case TuneTask::Mode::kCompile: s = Compile(task, a); break;
      case TuneTask::Mode::kTime: s = Time(task, a); break;
      case TuneTask::Mode::kCopy: s = TimeCopy(task, a); break;
    }
    if (!s.ok()) a.error = std::string(ToStd(s.message()));
    return a;
  }

  // False once the GPU context has a sticky error: nothing more can run in this process.
  bool ContextUsable() const {
    if (!gpu_) return true;
    const jit::Driver& cu = *internal::StateOf(*gpu_).driver;
    return cu.cuCtxSynchronize() == CUDA_SUCCESS;
  }
  const Runtime* gpu() const { return gpu_ ? &*gpu_ : nullptr; }

  absl::Status EnsureGpu() {
    if (gpu_) return absl::OkStatus();
    KJIT_ASSIGN_OR_RETURN(Runtime rt, Runtime::Create({.device = device_, .tuning_db = "off"}));
    gpu_.emplace(std::move(rt));
    KJIT_ASSIGN_OR_RETURN(timer_, GpuTimer::Create(*gpu_));
    return absl::OkStatus();
  }

 private:
  absl::Status Compile(const TuneTask& task, TuneAnswer& a) {
    auto it = compile_only_.find(task.target);
    if (it == compile_only_.end()) {
      KJIT_ASSIGN_OR_RETURN(
          Runtime rt,
          Runtime::Create({.target = task.target, .compile_only = true, .tuning_db = "off"}));
      it = compile_only_.emplace(task.target, std::move(rt)).first;
    }
    KJIT_ASSIGN_OR_RETURN(const OpSpec spec, ops::WithConfig(task.op, task.config));
    const auto t0 = std::chrono::steady_clock::now();
    KJIT_ASSIGN_OR_RETURN(const BuildInfo built, ops::Build(it->second, spec));
    a.compile_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    a.key = built.key;
    a.origin = built.origin;
    a.path = built.path;
    return absl::OkStatus();
  }

  absl::Status TimeCopy(const TuneTask& task, TuneAnswer& a) {
    KJIT_RETURN_IF_ERROR(EnsureGpu());
    KJIT_ASSIGN_OR_RETURN(a.timing, TimeDeviceCopy(*gpu_, *timer_, kCopyBytes, task.repeats));
    a.bytes = 2.0 * kCopyBytes;
    return absl::OkStatus();
  }

  absl::Status Time(const TuneTask& task, TuneAnswer& a) {
    KJIT_RETURN_IF_ERROR(EnsureGpu());
    KJIT_ASSIGN_OR_RETURN(const OpSpec spec, ops::WithConfig(task.op, task.config));
    const std::string problem =
        fmt::format("{} {} {} rows={}", ops::TuningOp(spec), ops::TuningShape(spec),
                    Name(ops::OpDType(spec)), task.rows);
    if (problem != trial_problem_) {
      trial_.reset();  // free the previous inputs before allocating the next
      trial_problem_.clear();
      KJIT_ASSIGN_OR_RETURN(trial_, ops::MakeTrial(*gpu_, spec, task.rows));
      trial_problem_ = problem;
    }
    KJIT_RETURN_IF_ERROR(trial_->Check(spec, task.pass));
    KJIT_ASSIGN_OR_RETURN(const ops::TimedWork work, trial_->Work(task.pass));
    KJIT_ASSIGN_OR_RETURN(
        a.timing, timer_->Time(task.repeats, work.launch, work.prepare, kCandidateBudgetUs));
    a.bytes = trial_->Bytes(task.pass);
    return absl::OkStatus();
  }

  std::map<std::string, Runtime> compile_only_;  // by target
  const int device_;
  std::optional<Runtime> gpu_;
  std::unique_ptr<GpuTimer> timer_;
  std::string trial_problem_;
  std::unique_ptr<ops::AnyTrial> trial_;
};

}  // namespace

int RunTuneWorker(std::istream& in, std::ostream& out, int device) {
  const nlohmann::json request = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!request.is_object() || !request.contains("tasks") || !request["tasks"].is_array()) {
    fmt::print(stderr, "kjit-tune worker: expected {{\"tasks\": [...]}} on stdin\n");
    return 2;
  }
  Worker worker(device);
  const nlohmann::json& tasks = request["tasks"];
  for (size_t i = 0; i < tasks.size(); ++i) {
    out << nlohmann::json{{"begin", i}}.dump() << std::endl;
    TuneAnswer answer;
    auto task = TuneTask::FromJson(tasks[i].dump());
    if (!task.ok()) {
      answer.error = std::string(ToStd(task.status().message()));
    } else {
      if (task->mode != TuneTask::Mode::kCompile) {
        // The fault is injected in a live context, like a real one would happen.
        if (absl::Status s = worker.EnsureGpu(); !s.ok())
          answer.error = std::string(ToStd(s.message()));
      }
      if (answer.error.empty()) {
        MaybeInjectFault(worker.gpu(), *task);
        answer = worker.Run(*task);
      }
    }
    const bool usable = worker.ContextUsable();
    if (!usable && answer.error.empty()) answer.error = "the GPU context failed after this task";
    // ToJson's dump() throws on invalid UTF-8, and the cache path (or an error naming it) is
    // whatever bytes KJIT_CACHE_DIR holds: a worker that aborted here failed every kernel.
    for (std::string* text : {&answer.error, &answer.key, &answer.origin, &answer.path}) {
      *text = jit::ValidUtf8(*text);
    }
    out << jit::JsonText(
               nlohmann::json{{"end", i}, {"result", nlohmann::json::parse(answer.ToJson())}})
        << std::endl;
    if (!usable) return kContextLost;
  }
  return 0;
}

}  // namespace kjit::autotune
