// kjit-tune: prebuild the kernels a model needs (RMSNorm with and without the fused residual,
// cross-entropy over its vocab) for the GPU present or for explicit targets, so that a training
// job finds them in the cache.
//
//   kjit-tune --model llama-3.1-8b                 # the GPU present, else sm_90 and sm_100
//   kjit-tune --config path/config.json --arch sm_90,sm_100 --json
//
// The autotuner (timing candidate configs per token count) is not built yet: every kernel uses the
// heuristic config, and the report says so ("tuned": false) rather than pretending.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/model_config.h"
#include "runtime/kjit.h"
#include "runtime/version.h"
#include "tools/targets.h"

namespace kjit::tools {
namespace {

struct TuneFlags {
  std::string model;
  std::string config;
  int64_t vocab = 0;
  int64_t hidden = 0;
  std::string dtype = "bf16";
  std::vector<int64_t> tokens = {1024, 4096, 16384};
  std::string arch = "auto";
  bool compile_only = false;
  int jobs = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  bool json = false;
  std::string trace;
};

// One kernel program to build for one target.
struct Job {
  std::string op;     // "rms_norm", "rms_norm+residual", "cross_entropy"
  std::string shape;  // "hidden=4096", "vocab=128256"
  const Runtime* rt = nullptr;
  std::function<absl::StatusOr<jit::Jit::Built>(const Runtime&)> build;
};

absl::StatusOr<autotune::ModelConfig> ModelFromFlags(const TuneFlags& f) {
  const int sources = !f.model.empty() + !f.config.empty() + (f.vocab > 0 || f.hidden > 0);
  if (sources > 1) {
    return absl::InvalidArgumentError("give one of --model, --config or --vocab/--hidden");
  }
  if (!f.config.empty()) return autotune::LoadHfConfig(f.config);
  if (f.vocab > 0 || f.hidden > 0) {
    if (f.vocab <= 0 || f.hidden <= 0) {
      return absl::InvalidArgumentError("--vocab and --hidden go together");
    }
    return autotune::ModelConfig{.name = "custom", .hidden_size = f.hidden, .vocab_size = f.vocab};
  }
  return autotune::ModelPreset(f.model.empty() ? "llama-3.1-8b" : f.model);
}

std::vector<Job> PlanJobs(const autotune::ModelConfig& m, DType dtype,
                          const std::vector<Runtime>& runtimes) {
  std::vector<Job> jobs;
  for (const Runtime& rt : runtimes) {
    for (bool residual : {false, true}) {
      RmsNormSpec spec{.hidden = m.hidden_size, .dtype = dtype,
                       .eps = static_cast<float>(m.rms_norm_eps),
                       .weight_offset = m.gemma_norm ? 1.0f : 0.0f,
                       .casting = m.gemma_norm ? RmsNormCasting::kGemma : RmsNormCasting::kLlama,
                       .fused_residual = residual};
      jobs.push_back({residual ? "rms_norm+residual" : "rms_norm",
                      fmt::format("hidden={}", m.hidden_size), &rt,
                      [spec](const Runtime& r) -> absl::StatusOr<jit::Jit::Built> {
                        KJIT_ASSIGN_OR_RETURN(RmsNorm op, r.RmsNorm(spec));
                        return op.Build();
                      }});
    }
    CrossEntropySpec spec{.vocab = m.vocab_size, .dtype = dtype,
                          .softcap = static_cast<float>(m.final_logit_softcapping)};
    jobs.push_back({"cross_entropy", fmt::format("vocab={}", m.vocab_size), &rt,
                    [spec](const Runtime& r) -> absl::StatusOr<jit::Jit::Built> {
                      KJIT_ASSIGN_OR_RETURN(CrossEntropy op, r.CrossEntropy(spec));
                      return op.Build();
                    }});
  }
  return jobs;
}

// Progress on stderr: one rewritten line on a terminal, a line per finished kernel otherwise.
class Progress {
 public:
  explicit Progress(size_t total) : total_(total), tty_(isatty(STDERR_FILENO) == 1) {}
  void Done(const Job& job, const std::string& outcome, bool failed) {
    std::lock_guard<std::mutex> lock(mu_);
    ++done_;
    failed_ += failed;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const std::string line = fmt::format("[{}/{}] {} {} {}: {} ({:.1f} s, {} failed)", done_, total_,
                                         job.op, job.shape, job.rt->target().ToString(), outcome, s,
                                         failed_);
    if (tty_) {
      fmt::print(stderr, "\r\033[K{}{}", line, done_ == total_ ? "\n" : "");
    } else {
      fmt::print(stderr, "{}\n", line);
    }
  }

 private:
  std::mutex mu_;
  size_t total_, done_ = 0, failed_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

int RunTune(const TuneFlags& f) {
  auto model = ModelFromFlags(f);
  if (!model.ok()) {
    fmt::print(stderr, "kjit-tune: {}\n", ToStd(model.status().message()));
    // Without --config the error is in the flags (their combination, an unknown preset): a usage
    // error, like CLI11's own; a bad config file is a failure.
    return f.config.empty() ? 2 : 1;
  }
  auto dtype = ParseDType(f.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto runtimes = RuntimesForArch(f.arch, /*use_gpu=*/!f.compile_only);
  if (!runtimes.ok()) return Fail(runtimes.status());
  const bool on_gpu = !runtimes->empty() && !runtimes->front().compile_only();
  if (on_gpu) {
    fmt::print(stderr,
               "kjit-tune: note: the autotuner is not built yet; the kernels use heuristic configs "
               "and are built and loaded on {}, not timed\n",
               runtimes->front().device().name);
  } else {
    fmt::print(stderr, "kjit-tune: no GPU in use: compiling only, nothing is timed\n");
  }

  const std::vector<Job> jobs = PlanJobs(*model, *dtype, *runtimes);
  std::vector<nlohmann::json> report(jobs.size());
  Progress progress(jobs.size());
  std::atomic<size_t> next{0};
  std::atomic<int> failures{0};
  auto worker = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      const Job& job = jobs[i];
      const auto t0 = std::chrono::steady_clock::now();
      auto built = job.build(*job.rt);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::json e = {{"op", job.op}, {"shape", job.shape},
                          {"target", job.rt->target().ToString()}, {"tuned", false},
                          {"tokens", f.tokens}, {"build_ms", ms}};
      if (built.ok()) {
        const jit::Binary& bin = *built->binary;
        e["key"] = built->key;
        e["config"] = bin.params.count("config") ? bin.params.at("config") : "";
        e["origin"] = jit::OriginName(built->origin);
        e["path"] = built->path;
        progress.Done(job, jit::OriginName(built->origin), false);
      } else {
        ++failures;
        e["error"] = std::string(ToStd(built.status().message()));
        progress.Done(job, "FAILED: " + e["error"].get<std::string>(), true);
      }
      report[i] = std::move(e);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 0; t < std::min<int>(f.jobs, static_cast<int>(jobs.size())); ++t) pool.emplace_back(worker);
  for (std::thread& t : pool) t.join();

  if (f.json) {
    fmt::print("{}\n", nlohmann::json{{"model", model->name},
                                      {"hidden_size", model->hidden_size},
                                      {"vocab_size", model->vocab_size},
                                      {"dtype", f.dtype},
                                      {"kernels", report}}
                           .dump(2));
  }
  fmt::print(stderr, "kjit-tune: {} {}: {} of {} kernels ready{}\n", model->name, f.dtype,
             jobs.size() - failures, jobs.size(), failures ? ", see the errors above" : "");
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace kjit::tools

int main(int argc, char** argv) {
  using kjit::tools::TuneFlags;
  TuneFlags f;
  std::string presets;
  for (const std::string& n : kjit::autotune::ModelPresetNames()) presets += (presets.empty() ? "" : ", ") + n;
  CLI::App app{"kjit-tune: prebuild (and, once the autotuner exists, tune) the kernels a model "
               "needs, into the kernel cache",
               "kjit-tune"};
  app.set_version_flag("--version", [] { return kjit::FullVersionString(); });
  app.add_option("--model", f.model, "A built-in model (default llama-3.1-8b): " + presets);
  app.add_option("--config", f.config, "A Hugging Face config.json (hidden_size, vocab_size, "
                                       "rms_norm_eps, final_logit_softcapping, model_type)");
  app.add_option("--vocab", f.vocab, "Vocab size (with --hidden, instead of a model)")
      ->check(CLI::Range(2, 1 << 20));
  app.add_option("--hidden", f.hidden, "Hidden size (with --vocab)")->check(CLI::Range(1, 65536));
  app.add_option("--dtype", f.dtype, "fp32, fp16 or bf16")
      ->check(CLI::IsMember({"fp32", "fp16", "bf16"}))
      ->capture_default_str();
  app.add_option("--tokens", f.tokens, "Token counts to tune for (recorded; tuning is not built yet)")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  app.add_option("--arch", f.arch, "auto (the GPU present, else sm_90,sm_100) or targets: sm_90,sm_100")
      ->capture_default_str();
  app.add_flag("--compile-only", f.compile_only, "Do not use a GPU even if one is present");
  app.add_option("--jobs", f.jobs, "Kernels compiled at once")->check(CLI::Range(1, 256))->capture_default_str();
  app.add_flag("--json", f.json, "Print a JSON report of every kernel on stdout");
  app.add_option("--trace", f.trace,
                 "Write a Chrome trace (compiles, cache hits, loads) to FILE at exit; as KJIT_TRACE")
      ->type_name("FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  // Before anything traces: the tracer reads the environment once.
  if (!f.trace.empty()) ::setenv("KJIT_TRACE", f.trace.c_str(), 1);
  return kjit::tools::RunTune(f);
}
