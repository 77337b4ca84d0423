// kjit-tune: tune and prebuild the kernels a model needs (RMSNorm with and without the fused
// residual, cross-entropy over its vocab). On a GPU every candidate config is compiled in worker
// processes, checked against the reference and timed at each token count, and the fastest goes to
// the tuning database the ops read; without one the heuristic configs are compiled for the default
// targets so that a training job finds them in the cache.
//
//   kjit-tune --model llama-3.1-8b                 # the GPU present, else sm_90 and sm_100
//   kjit-tune --config path/config.json --arch sm_90,sm_100 --json
//   kjit-tune --model llama-3.1-8b --device 3       # tune on GPU 3 (an error if there is none)
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "autotune/model_config.h"
#include "autotune/tune_worker.h"
#include "autotune/tuner.h"
#include "jit/json_text.h"
#include "jit/printable.h"
#include "jit/status_helpers.h"
#include "jit/trace.h"
#include "kjit/kjit.h"
#include "kjit/version.h"
#include "ops/common/json_fields.h"
#include "runtime/tuning_db.h"
#include "tools/commands.h"
#include "tools/op_flags.h"
#include "tools/targets.h"

namespace kjit::tools {
namespace {

struct TuneFlags {
  std::string model;
  std::string config;
  int64_t vocab = 0;
  int64_t hidden = 0;
  std::string dtype = "bf16";
  // The ops' own flags (--casting, --class-weights: OpTrait::Flags), over the model's choices.
  OpFlagOptions op_flags{ops::FlagCommand::kTune};
  std::vector<int64_t> tokens = {1024, 4096, 16384};
  std::string arch = "auto";
  std::optional<int> device;  // --device: the GPU to tune on; unset: GPU 0 if there is one
  bool compile_only = false;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json = false;
  std::string trace;
  bool all_candidates = false;
  bool retune = false;
  int repeats = 20;
  int timeout_s = 120;
  std::string db;
  std::string spec;  // one op, as ops/registry.h's SpecToJson writes it
};

// What CLI11 cannot check once it has parsed the flags, from the flags alone: one source of ops, a
// known preset, a valid --spec, and flags that go together.
absl::Status CheckTuneFlags(const TuneFlags& f, const CLI::App& app) {
  const auto given = [&app](const char* flag) { return app.count(flag) > 0; };
  const int sources = given("--model") + given("--config") +
                      (given("--vocab") || given("--hidden")) + given("--spec");
  if (sources > 1) {
    return absl::InvalidArgumentError("give one of --model, --config, --vocab/--hidden or --spec");
  }
  if (given("--vocab") != given("--hidden")) {
    return absl::InvalidArgumentError("--vocab and --hidden go together");
  }
  if (given("--model")) {
    KJIT_RETURN_IF_ERROR(ops::Renamed(autotune::ModelPreset(f.model).status(), "--model"));
  }
  if (given("--spec")) {
    KJIT_RETURN_IF_ERROR(Annotate(ops::SpecFromJson(f.spec).status(), "--spec"));
    std::vector<std::string> own = {"--dtype"};
    for (const ops::CommandFlag& o : f.op_flags.flags()) own.push_back(o.info.name);
    for (const std::string& flag : own) {
      if (given(flag.c_str())) {
        return absl::InvalidArgumentError(
            fmt::format("{} does not apply to --spec, which has its own", flag));
      }
    }
  }
  std::vector<std::pair<std::string, std::string>> dtypes = {{"--dtype", f.dtype}};
  for (auto& d : f.op_flags.DTypeFlags()) dtypes.push_back(std::move(d));
  for (const auto& [flag, dtype] : dtypes) {  // an op's dtype flag is for weights: fp32 or --dtype
    if (flag != "--dtype" && given(flag.c_str()) && dtype != "fp32" && dtype != f.dtype) {
      return absl::InvalidArgumentError(
          fmt::format("{} {}: must be fp32 or --dtype ({})", flag, dtype, f.dtype));
    }
  }
  if (!given("--spec")) {  // a spec's dtype is its own, checked as its op is built
    KJIT_RETURN_IF_ERROR(CheckDTypesForArch(f.arch, dtypes));
  }
  // Explicit targets are compile-only runtimes, like --compile-only: nothing is timed on them.
  const bool compile_only = f.compile_only || f.arch != "auto";
  const std::string why = f.compile_only ? "--compile-only" : "--arch " + f.arch;
  if (f.device && compile_only) {
    return absl::InvalidArgumentError(fmt::format(
        "--device {}: picks the GPU to tune on, so it cannot go with {}", *f.device, why));
  }
  for (const char* flag : {"--repeats", "--retune"}) {
    if (compile_only && given(flag)) {
      return absl::InvalidArgumentError(
          fmt::format("{} does not apply with {}: nothing is timed", flag, why));
    }
  }
  return absl::OkStatus();
}

// The model the flags name: CheckTuneFlags checked all but the --config file, read here.
absl::StatusOr<autotune::ModelConfig> ModelFromFlags(const TuneFlags& f) {
  if (!f.spec.empty()) return autotune::ModelConfig{.name = "spec"};
  if (!f.config.empty()) return autotune::LoadHfConfig(f.config);
  if (f.vocab > 0) {
    return autotune::ModelConfig{.name = "custom", .hidden_size = f.hidden, .vocab_size = f.vocab};
  }
  return autotune::ModelPreset(f.model.empty() ? "llama-3.1-8b" : f.model);
}

// The ops a model's fine-tuning runs (every op's OpTrait::ModelOps), with the ops' flags given
// over the model's choices.
absl::StatusOr<std::vector<ops::OpSpec>> ModelOps(const autotune::ModelConfig& m, DType dtype,
                                                  const TuneFlags& f) {
  const ops::ModelShape shape{.hidden = m.hidden_size,
                              .vocab = m.vocab_size,
                              .rms_norm_eps = m.rms_norm_eps,
                              .final_logit_softcapping = m.final_logit_softcapping,
                              .norm_rounds_once = m.norm_rounds_once,
                              .norm_weight_offset = m.norm_weight_offset};
  return ops::ModelOps(shape, dtype, {f.op_flags.given().begin(), f.op_flags.given().end()});
}

// Progress on stderr: one rewritten line on a terminal, a line per finished task otherwise.
class Progress {
 public:
  Progress() : tty_(isatty(STDERR_FILENO) == 1) {}
  autotune::TuneProgress Callbacks() {
    return {.phase =
                [this](const std::string& phase, size_t tasks) {
                  std::lock_guard<std::mutex> lock(mu_);
                  phase_ = phase;
                  total_ = tasks;
                  done_ = 0;
                },
            .step = [this](const std::string& what, bool failed) { Step(what, failed); }};
  }
  int failed() const { return failed_; }

 private:
  void Step(const std::string& what, bool failed) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    failed_ += failed;
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const std::string line =
        fmt::format("[{} {}/{}] {}{} ({:.1f} s, {} failed)", phase_, done_, total_,
                    jit::Printable(what), failed ? ": FAILED" : "", s, failed_);
    if (tty_) {
      fmt::print(stderr, "\r\033[K{}{}", line.substr(0, 160), done_ == total_ ? "\n" : "");
    } else {
      fmt::print(stderr, "{}\n", line);
    }
  }

  std::mutex mu_;
  std::string phase_;
  size_t total_ = 0, done_ = 0;
  int failed_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

// The tuned kernels in a table on stderr (the report on stdout stays machine-readable).
void PrintSummary(const nlohmann::json& report) {
  for (const auto& k : report["kernels"]) {
    if (!k.value("tuned", false)) continue;
    std::string speed;
    if (k.contains("ratio_to_copy")) {
      speed = fmt::format(", {:.0f}% of copy", 100 * k["ratio_to_copy"].get<double>());
    }
    fmt::print(stderr, "kjit-tune: {} {} rows<={}: [{}] {:.1f} us, {:.2f}x the heuristic{}{}\n",
               k["op"].get<std::string>(), k["shape"].get<std::string>(), k["rows"].get<int64_t>(),
               k["config"].get<std::string>(), k["median_us"].get<double>(),
               k.value("speedup_over_heuristic", 1.0), speed,
               k["from_database"].get<bool>() ? " (from the database)" : "");
  }
  for (const auto& f : report["failures"]) {
    fmt::print(stderr, "kjit-tune: failed: {}\n", jit::JsonText(f));
  }
}

int RunTune(const TuneFlags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  auto model = ModelFromFlags(f);
  if (!model.ok()) return Fail(model.status());
  std::vector<ops::OpSpec> ops;
  DType dtype = ParseDType(f.dtype).value();  // checked by its validator
  if (f.spec.empty()) {
    auto model_ops = ModelOps(*model, dtype, f);
    if (!model_ops.ok()) return Fail(model_ops.status());
    ops = std::move(*model_ops);
  } else {
    ops = {*ops::SpecFromJson(f.spec)};  // checked by CheckTuneFlags
    dtype = ops::OpDType(ops.front());
  }
  absl::StatusOr<std::vector<Runtime>> runtimes = std::vector<Runtime>{};
  if (f.device) {
    auto rt = RuntimeOnDevice(*f.device);
    if (!rt.ok()) return Fail(rt.status());
    runtimes->push_back(std::move(*rt));
  } else {
    runtimes = RuntimesForArch(f.arch, /*use_gpu=*/!f.compile_only);
  }
  if (!runtimes.ok()) return Fail(runtimes.status());
  const Runtime* gpu =
      !runtimes->empty() && !runtimes->front().compile_only() ? &runtimes->front() : nullptr;
  autotune::TunePlan plan{.ops = std::move(ops),
                          .tokens = f.tokens,
                          .gpu = gpu,
                          .all_candidates = f.all_candidates,
                          .retune = f.retune,
                          .jobs = f.jobs,
                          .repeats = f.repeats,
                          .task_timeout = std::chrono::seconds(f.timeout_s),
                          .worker_command = {"/proc/self/exe", "--worker", "--device",
                                             std::to_string(f.device.value_or(0))},
                          .db_path = f.db.empty() ? internal::TuningDb::DefaultPath() : f.db};
  for (const Runtime& rt : *runtimes) plan.targets.push_back(&rt);
  if (gpu) {
    fmt::print(stderr, "kjit-tune: tuning on {} ({}) at {} token counts; database {}\n",
               gpu->device().name, gpu->target(), f.tokens.size(), jit::Printable(plan.db_path));
  } else {
    fmt::print(stderr, "kjit-tune: no GPU in use: compiling {} only, nothing is timed\n",
               f.all_candidates ? "every candidate config" : "the heuristic configs");
  }
  Progress progress;
  nlohmann::json report = autotune::Tune(plan, progress.Callbacks());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report["model"] = model->name;
  report["hidden_size"] = model->hidden_size;
  report["vocab_size"] = model->vocab_size;
  report["dtype"] = Name(dtype);
  report["tokens"] = f.tokens;
  report["wall_s"] = seconds;
  if (f.json) fmt::print("{}\n", jit::JsonText(report, 2));
  PrintSummary(report);
  size_t ready = 0;
  // A kernel compiled but not stored (a read-only cache) is not ready for the next run.
  for (const auto& k : report["kernels"])
    ready += !k.value("tuned", false) && k.value("stored", true);
  const size_t wanted = plan.ops.size() * plan.targets.size();
  // The name may be a config.json's _name_or_path: anything.
  fmt::print(stderr, "kjit-tune: {} {}: {} of {} kernels ready{} in {:.1f} s{}\n",
             jit::Printable(model->name), Name(dtype), ready, wanted, gpu ? ", tuned" : "", seconds,
             report["ok"].get<bool>() ? "" : "; FAILED, see above");
  return report["ok"].get<bool>() ? 0 : 1;
}

}  // namespace

ParsedCommandLine ParseKjitTuneCommandLine(int argc, const char* const* argv, std::ostream& out,
                                           std::ostream& err) {
  auto f = std::make_shared<TuneFlags>();
  std::string presets;
  for (const std::string& n : autotune::ModelPresetNames()) {
    presets += (presets.empty() ? "" : ", ") + n;
  }
  CLI::App app{
      "kjit-tune: tune (on a GPU) and prebuild the kernels a model needs, into the kernel "
      "cache and the tuning database",
      "kjit-tune"};
  app.set_version_flag("--version", [] { return FullVersionString(); });
  app.failure_message(UsageMessage);
  app.add_option("--model", f->model, "A built-in model (default llama-3.1-8b): " + presets);
  app.add_option("--config", f->config,
                 "A Hugging Face config.json (hidden_size, vocab_size, "
                 "rms_norm_eps, final_logit_softcapping, model_type)");
  app.add_option("--spec", f->spec,
                 "One op spec as JSON instead of a model's ops (what a runtime "
                 "with KJIT_AUTOTUNE=1 passes)")
      ->type_name("JSON");
  app.add_option("--vocab", f->vocab, "Vocab size (with --hidden, instead of a model)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--hidden", f->hidden, "Hidden size (with --vocab)")->check(CLI::Range(1, 65536));
  app.add_option("--dtype", f->dtype, "fp32, fp16 or bf16 (not with --spec)")
      ->check(DTypeValidator())
      ->capture_default_str();
  f->op_flags.AddOptions(&app, [](const ops::FlagInfo&) { return true; });
  app.add_option("--tokens", f->tokens,
                 "Token counts (rows) to tune at, each rounded up to a "
                 "power of two (a launch takes at most 2^31 - 1 rows)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{std::numeric_limits<int32_t>::max()}))
      ->capture_default_str();
  app.add_option("--arch", f->arch,
                 "auto (the GPU present, else sm_90,sm_100) or targets: sm_90,sm_100")
      ->check(ArchValidator())
      ->capture_default_str();
  app.add_option("--device", f->device,
                 "The GPU to tune on, by CUDA ordinal (default: GPU 0 if "
                 "there is one, else compile only); an error if it is absent")
      ->check(CLI::Range(0, 4095));
  app.add_flag("--compile-only", f->compile_only, "Do not use a GPU even if one is present");
  app.add_flag("--all-candidates", f->all_candidates,
               "Compile every candidate config of the search space, not only the heuristic's "
               "(without a GPU; with one every candidate is compiled anyway)");
  app.add_flag("--retune", f->retune, "Tune again what the tuning database already has");
  app.add_option("--jobs", f->jobs, "Compile workers at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--repeats", f->repeats,
                 "Timed repeats per candidate, at most: a candidate stops after 0.25 s of GPU "
                 "time (5 repeats at least)")
      ->check(CLI::Range(3, 10000))
      ->capture_default_str();
  app.add_option("--timeout", f->timeout_s,
                 "Seconds a worker may go without answering before it "
                 "is killed and its candidate fails")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--db", f->db,
                 "The tuning database (default $KJIT_TUNING_DB, else tuning.json in "
                 "the cache directory)")
      ->type_name("FILE");
  app.add_flag("--json", f->json, "Print a JSON report of every kernel on stdout");
  app.add_option(
         "--trace", f->trace,
         "Write a Chrome trace (compiles, cache hits, loads) to FILE at exit; as KJIT_TRACE")
      ->type_name("FILE");
  app.final_callback([f, &app] {
    f->op_flags.Record(app);
    ThrowIfUsageError(CheckTuneFlags(*f, app));
  });
  if (std::optional<int> code = ParseFlags(app, argc, argv, out, err)) return {.exit_code = code};
  return {.run = [f] {
    if (!f->trace.empty()) jit::StartTraceFile(f->trace);
    return RunTune(*f);
  }};
}

}  // namespace kjit::tools

// Left out of the CLI fuzzer (tests/fuzz), which links this file for ParseKjitTuneCommandLine and
// has libFuzzer's main.
#ifndef KJIT_CLI_NO_MAIN
int main(int argc, char** argv) {
  kjit::tools::SetToolName("kjit-tune");
  // A worker of the tuner's pool (autotune/worker_pool.h): tasks on stdin, answers on stdout,
  // started by RunTune as `--worker --device N`.
  if (argc >= 2 && std::string(argv[1]) == "--worker") {
    int device = -1;
    if (argc == 4 && std::string(argv[2]) == "--device") {
      const std::string_view n = argv[3];
      if (std::from_chars(n.data(), n.data() + n.size(), device).ptr != n.data() + n.size())
        device = -1;
    }
    if (device < 0) {
      fmt::print(stderr, "kjit-tune: --worker takes exactly --device N (a GPU ordinal)\n");
      return 2;
    }
    return kjit::autotune::RunTuneWorker(std::cin, std::cout, device);
  }
  return kjit::tools::Finish(
      kjit::tools::ParseKjitTuneCommandLine(argc, argv, std::cout, std::cerr));
}
#endif
