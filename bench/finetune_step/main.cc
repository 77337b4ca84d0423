// finetune_step: the last layers of a LLaMA-style fine-tuning step on random data with a real
// model's shapes (final RMSNorm, lm_head matmul through cuBLASLt, cross-entropy over shifted
// targets with ignore_index, and the backward through all three), run two ways in one process: as
// an eager framework runs it (the baseline) and with kjit's kernels, whole and over row chunks.
// For each: the step time (median of many, cold L2), the peak device memory, and the loss and
// gradients checked against the baseline's.
//
//   finetune_step                                   # llama-3.1-8b, batch 4 x seq 2048, bf16
//   finetune_step --model llama-3.2-1b --batch 1 --seq 256 --steps 5
//   finetune_step --config path/config.json --json --trace trace.json
//
// Exit status: 0 the paths ran and agree; 1 an error, or a path disagrees with the baseline;
// 2 bad flags; 3 a path did not fit in device memory (the message says which and how much it
// needed; the other paths still run); 77 skipped: no usable GPU (the CUDA driver or a device is
// missing), as test harnesses count it.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "autotune/gpu_timer.h"
#include "autotune/model_config.h"
#include "bench/finetune_step/step.h"
#include "jit/status_helpers.h"
#include "jit/trace.h"
#include "ops/common/tuning/compare.h"

namespace finetune {
namespace {

constexpr int kExitDisagree = 1;
constexpr int kExitUsage = 2;
constexpr int kExitOutOfMemory = 3;
constexpr int kExitNoGpu = 77;

// The loss is a mean of fp32 row losses from nearly the same bf16 logits; the ignored last
// positions alone move it by 1 / seq (5e-4 at seq 2048), so a wrong divisor fails.
constexpr double kLossRtol = 1e-4;
// Gradients. dx and dnorm_weight elementwise: |a - b| <= kGradTol (|b| + rms of b's row). Between
// the paths dy may differ by a bf16 ulp (2^-7 relative at most; the chunked path's matmuls have
// other shapes), the baseline rounds dy * w to bf16 (2^-8 more), and the results are rounded to
// bf16 (another ulp): under 0.02 relative in all, below 2^-5, while an all-zero or wrongly scaled
// gradient fails. The lm_head's gradient (a sum over every token, in fp32 over the chunks) is held
// to ||a - b|| <= kGradTol ||b|| row by row instead.
constexpr double kGradTol = 1.0 / 32;
// The lm_head's gradient is compared on this many of its rows: the first targets' rows, which
// carry the -1/valid terms, and rows spread over the vocab.
constexpr int kSampledTargetRows = 32;
constexpr int kSampledSpreadRows = 224;

constexpr char kCounted[] =
    "peak memory = the most bytes live at once in the buffers a path allocates (every one through "
    "a counting allocator), plus the shared inputs (hidden states, norm weight, lm_head weight, "
    "targets), which every path reads; not counted: the CUDA context, loaded modules, cuBLASLt's "
    "handle and the timer's 512 MiB L2-flush buffer";

struct Flags {
  int64_t batch = 4;
  int64_t seq = 2048;
  std::string model;
  std::string config;
  int steps = 20;
  int64_t chunk_rows = 1024;
  bool json = false;
  std::string trace;
};

// What a path measured, and its last step's results for the comparison.
struct PathReport {
  std::string name;
  int64_t chunk_rows = 0;  // 0: the baseline, which does not chunk
  absl::Status status;     // not ok: the path did not run to the end (e.g. out of memory)
  kjit::autotune::Timing timing;
  DevicePool::Stats memory;
  double loss = 0;
  std::vector<double> dx, dnorm_weight, dlm_head_rows;
};

struct Agreement {
  bool elementwise = true;  // the gate: elementwise, else the relative error of each row's norm
  double max_abs = 0;
  double max_rel = 0;    // |a - b| / max(|b|, the row's atol)
  double worst_row = 0;  // max over rows of ||a - b|| / ||b||
  kjit::ops::CompareResult result;
  bool ok() const { return elementwise ? result.ok : worst_row <= kGradTol; }
};

// What CLI11's checks of single flags leave out.
absl::Status CheckFlags(const Flags& f) {
  if (!f.model.empty() && !f.config.empty()) {
    return absl::InvalidArgumentError("--model and --config: give one of them");
  }
  if (f.batch * f.seq > 0x7fffffff) {
    return absl::InvalidArgumentError(
        fmt::format("--batch x --seq: {} tokens is more than 2^31 - 1", f.batch * f.seq));
  }
  return absl::OkStatus();
}

absl::StatusOr<Problem> ProblemFromFlags(const Flags& f) {
  kjit::autotune::ModelConfig m;
  if (!f.config.empty()) {
    KJIT_ASSIGN_OR_RETURN(m, kjit::autotune::LoadHfConfig(f.config));
  } else {
    KJIT_ASSIGN_OR_RETURN(m,
                          kjit::autotune::ModelPreset(f.model.empty() ? "llama-3.1-8b" : f.model));
  }
  // The baseline implements LLaMA's norm and plain logits only.
  if (m.norm_rounds_once || m.norm_weight_offset != 0 || m.final_logit_softcapping > 0) {
    return absl::InvalidArgumentError(fmt::format(
        "{}: uses Gemma-style RMSNorm (rounded once, or (1 + w)) or logit soft-capping; this "
        "example runs LLaMA-style steps (LLaMA's norm, no soft-capping)",
        f.config.empty() ? "--model " + m.name : "--config " + f.config));
  }
  return Problem{.model = m.name,
                 .batch = f.batch,
                 .seq = f.seq,
                 .hidden = m.hidden_size,
                 .vocab = m.vocab_size,
                 .eps = static_cast<float>(m.rms_norm_eps)};
}

std::vector<int64_t> SampledVocabRows(const SharedInputs& in, int64_t vocab) {
  std::set<int64_t> rows;
  for (int64_t t : in.host_targets) {
    if (rows.size() >= kSampledTargetRows) break;
    if (t != kIgnoreIndex) rows.insert(t);
  }
  for (int64_t i = 0; i < kSampledSpreadRows; ++i)
    rows.insert(i * (vocab - 1) / (kSampledSpreadRows - 1));
  return {rows.begin(), rows.end()};
}

// Creates a path, times `steps` steps (after one untimed step, which is when its pool allocates),
// and reads back the last step's loss and (read_results) gradients: dx, dnorm_weight and the
// lm_head gradient's `vocab_rows`. Out of memory is a result, not an error.
absl::StatusOr<PathReport> MeasurePath(
    const kjit::Runtime& rt, kjit::autotune::GpuTimer& timer, int steps,
    const std::vector<int64_t>& vocab_rows, std::string name, int64_t chunk_rows, bool read_results,
    const std::function<absl::StatusOr<std::unique_ptr<Path>>()>& make) {
  PathReport report{.name = std::move(name), .chunk_rows = chunk_rows};
  const kjit::jit::TraceSpan span("finetune_step " + report.name, "example",
                                  {{"chunk_rows", std::to_string(chunk_rows)}});
  auto path = make();
  absl::StatusOr<kjit::autotune::Timing> timing =
      path.ok() ? timer.Time(steps, [&] { return (*path)->Step(); }) : path.status();
  if (path.ok()) report.memory = (*path)->pool().stats();
  if (!timing.ok()) {
    if (!absl::IsResourceExhausted(timing.status())) return timing.status();
    report.status = timing.status();
    return report;
  }
  report.timing = *timing;
  const Path& p = **path;
  KJIT_ASSIGN_OR_RETURN(report.loss, p.Loss());
  if (!read_results) return report;
  KJIT_ASSIGN_OR_RETURN(report.dx, Download(rt, p.dx().view));
  KJIT_ASSIGN_OR_RETURN(report.dnorm_weight, Download(rt, p.dnorm_weight().view));
  for (int64_t row : vocab_rows) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> values,
                          Download(rt, Rows(p.dlm_head().view, row, 1)));
    report.dlm_head_rows.insert(report.dlm_head_rows.end(), values.begin(), values.end());
  }
  return report;
}

// `out` against `ref`, both rows of `cols` values.
Agreement Agree(const std::vector<double>& out, const std::vector<double>& ref, int64_t cols,
                bool elementwise) {
  Agreement a{.elementwise = elementwise};
  std::vector<double> atol(ref.size());
  for (size_t first = 0; first < ref.size() && out.size() == ref.size(); first += cols) {
    const size_t end = std::min(ref.size(), first + cols);
    double ref_sq = 0, err_sq = 0;
    for (size_t i = first; i < end; ++i) {
      ref_sq += ref[i] * ref[i];
      err_sq += (out[i] - ref[i]) * (out[i] - ref[i]);
    }
    const double row_atol = kGradTol * std::sqrt(ref_sq / static_cast<double>(end - first));
    // A row that is zero in both (an ignored position's dx) agrees.
    const double row_err = err_sq == 0 ? 0 : std::sqrt(err_sq / ref_sq);
    a.worst_row = std::isfinite(row_err) ? std::max(a.worst_row, row_err) : INFINITY;
    for (size_t i = first; i < end; ++i) {
      atol[i] = row_atol;
      const double err = std::fabs(out[i] - ref[i]);
      a.max_abs = std::max(a.max_abs, err);
      a.max_rel = std::max(a.max_rel, err / std::max(std::fabs(ref[i]), row_atol));
    }
  }
  a.result = kjit::ops::Compare(out, ref, {.rtol = kGradTol}, atol);
  return a;
}

nlohmann::json AgreementJson(const Agreement& a) {
  return {{"gate", a.elementwise ? "elementwise" : "row norm"},
          {"max_abs_err", a.max_abs},
          {"max_rel_err", a.max_rel},
          {"worst_row_rel_norm_err", a.worst_row},
          {"elementwise_mismatches", a.result.mismatches},
          {"checked", a.result.checked},
          {"ok", a.ok()}};
}

std::string Summary(const char* name, const Agreement& a) {
  const std::string verdict =
      a.ok() ? "ok" : (a.elementwise ? a.result.Describe(name) : "a row is out of tolerance");
  return fmt::format("{} max abs {:.2e} max rel {:.2e} worst row {:.2e} ({})", name, a.max_abs,
                     a.max_rel, a.worst_row, verdict);
}

// What the report says besides the paths' own figures.
struct RunInfo {
  std::string device, target;
  size_t shared_bytes = 0;
  int64_t valid_targets = 0;
  size_t sampled_rows = 0;
};

// The paths' figures: a row of the table each, and their JSON. True when every path fitted.
bool ReportPaths(std::FILE* table, const RunInfo& info, const std::vector<PathReport>& reports,
                 nlohmann::json& json) {
  const PathReport& base = reports.front();
  const double base_peak = static_cast<double>(info.shared_bytes + base.memory.peak_bytes);
  fmt::print(table, "{:<14}{:>7}  {:>26}  {:>11}  {:>11}  {:>11}  {:>12}\n", "path", "chunk",
             "step ms: median (p10-p90)", "peak memory", "path only", "vs baseline", "loss");
  bool all_fit = true;
  for (const PathReport& r : reports) {
    const double peak = static_cast<double>(info.shared_bytes + r.memory.peak_bytes);
    const std::string chunk = r.chunk_rows ? std::to_string(r.chunk_rows) : "-";
    nlohmann::json j = {{"name", r.name}, {"chunk_rows", r.chunk_rows}, {"ok", r.status.ok()}};
    if (!r.status.ok()) {
      all_fit = false;
      j["error"] = std::string(kjit::ToStd(r.status.message()));
      fmt::print(table, "{:<14}{:>7}  did not fit: {} (plus {} of shared inputs)\n", r.name, chunk,
                 kjit::ToStd(r.status.message()), FormatBytes(info.shared_bytes));
      json.push_back(std::move(j));
      continue;
    }
    const std::string ratio = base.status.ok() ? fmt::format("{:.2f}x", base_peak / peak) : "-";
    fmt::print(table, "{:<14}{:>7}  {:>26}  {:>11}  {:>11}  {:>11}  {:>12.6f}\n", r.name, chunk,
               fmt::format("{:.2f} ({:.2f}-{:.2f})", r.timing.median_us / 1e3,
                           r.timing.p10_us / 1e3, r.timing.p90_us / 1e3),
               FormatBytes(peak), FormatBytes(r.memory.peak_bytes), ratio, r.loss);
    j["step_ms"] = {{"median", r.timing.median_us / 1e3},
                    {"p10", r.timing.p10_us / 1e3},
                    {"p90", r.timing.p90_us / 1e3},
                    {"steps", r.timing.repeats}};
    j["peak_bytes"] = info.shared_bytes + r.memory.peak_bytes;
    j["path_peak_bytes"] = r.memory.peak_bytes;
    j["path_reserved_peak_bytes"] = r.memory.peak_reserved_bytes;
    j["device_used_rise_bytes"] = r.memory.device_peak_delta_bytes;
    if (base.status.ok()) j["peak_ratio_vs_baseline"] = base_peak / peak;
    j["loss"] = r.loss;
    json.push_back(std::move(j));
  }
  fmt::print(table, "\ncross-check, rise of the device's used memory (cuMemGetInfo) in each path:");
  for (const PathReport& r : reports) {
    fmt::print(table, " {} {}", r.name, FormatBytes(r.memory.device_peak_delta_bytes));
  }
  fmt::print(table, "\n");
  return all_fit;
}

// Each kjit path's loss and gradients against the baseline's. True when all agree.
bool ReportAgreement(std::FILE* table, const Problem& p, const RunInfo& info,
                     const std::vector<PathReport>& reports, nlohmann::json& json) {
  const PathReport& base = reports.front();
  if (!base.status.ok()) {
    fmt::print(table, "\nno agreement check: the baseline did not run\n");
    return true;
  }
  fmt::print(table,
             "\nagreement with the baseline (loss: relative {:g}; dx, dnorm_weight: "
             "|a - b| <= {:g} (|b| + rms of b's row); dlm_head on {} rows: "
             "||a - b|| <= {:g} ||b|| per row):\n",
             kLossRtol, kGradTol, info.sampled_rows, kGradTol);
  bool agree = true;
  for (size_t i = 1; i < reports.size(); ++i) {
    const PathReport& r = reports[i];
    if (!r.status.ok()) continue;
    const double loss_rel = std::fabs(r.loss - base.loss) / std::fabs(base.loss);
    const Agreement dx = Agree(r.dx, base.dx, p.hidden, true);
    const Agreement dw = Agree(r.dnorm_weight, base.dnorm_weight, p.hidden, true);
    const Agreement dlm = Agree(r.dlm_head_rows, base.dlm_head_rows, p.hidden, false);
    const bool ok = loss_rel <= kLossRtol && dx.ok() && dw.ok() && dlm.ok();
    agree = agree && ok;
    fmt::print(table, "  {:<13} {}: loss rel {:.2e}; {}; {}; {}\n", r.name,
               ok ? "AGREE" : "DISAGREE", loss_rel, Summary("dx", dx), Summary("dnorm_weight", dw),
               Summary("dlm_head", dlm));
    json.push_back({{"path", r.name},
                    {"ok", ok},
                    {"loss_rel_err", loss_rel},
                    {"dx", AgreementJson(dx)},
                    {"dnorm_weight", AgreementJson(dw)},
                    {"dlm_head_sampled_rows", AgreementJson(dlm)}});
  }
  return agree;
}

int Run(const Flags& f, const Problem& p) {
  auto fail = [](const absl::Status& s) {
    fmt::print(stderr, "finetune_step: {}\n", kjit::ToStd(s.message()));
    return 1;
  };
  auto rt = kjit::Runtime::Create();
  if (!rt.ok()) return fail(rt.status());
  const bool aligned = p.hidden % 4 == 0 && p.vocab % 4 == 0;
  auto kernels = EagerKernels::Create(*rt, aligned ? 4 : 1);
  if (!kernels.ok()) return fail(kernels.status());
  auto timer = kjit::autotune::GpuTimer::Create(*rt);
  if (!timer.ok()) return fail(timer.status());

  DevicePool shared_pool(*rt, "shared inputs");
  auto in = MakeSharedInputs(*rt, p, *kernels, shared_pool);
  if (!in.ok()) {
    fmt::print(stderr, "finetune_step: the shared inputs do not fit: {}\n",
               kjit::ToStd(in.status().message()));
    return absl::IsResourceExhausted(in.status()) ? kExitOutOfMemory : 1;
  }
  const std::vector<int64_t> vocab_rows = SampledVocabRows(*in, p.vocab);
  const RunInfo info{.device = rt->device().name,
                     .target = rt->target(),
                     .shared_bytes = shared_pool.stats().live_bytes,
                     .valid_targets = in->valid_targets,
                     .sampled_rows = vocab_rows.size()};

  std::vector<PathReport> reports;
  struct Variant {
    std::string name;
    int64_t chunk_rows;
  };
  for (const Variant& variant : {Variant{"baseline", 0}, Variant{"kjit", p.tokens()},
                                 Variant{"kjit-chunked", std::min(f.chunk_rows, p.tokens())}}) {
    auto make = [&]() -> absl::StatusOr<std::unique_ptr<Path>> {
      if (variant.chunk_rows == 0) return MakeBaselinePath(*rt, p, *in, *kernels);
      return MakeKjitPath(*rt, p, *in, variant.chunk_rows, variant.name);
    };
    // Without the baseline's results there is nothing to compare with.
    const bool read_results = reports.empty() || reports.front().status.ok();
    auto report = MeasurePath(*rt, **timer, f.steps, vocab_rows, variant.name, variant.chunk_rows,
                              read_results, make);
    if (!report.ok()) return fail(kjit::Annotate(report.status(), variant.name));
    reports.push_back(std::move(*report));
  }

  // A table (stdout, or stderr when the JSON takes stdout) and the JSON.
  std::FILE* table = f.json ? stderr : stdout;
  fmt::print(table,
             "finetune_step: {} (hidden {}, vocab {}), batch {} x seq {} = {} tokens ({} "
             "with a target), bf16\n",
             p.model, p.hidden, p.vocab, p.batch, p.seq, p.tokens(), info.valid_targets);
  fmt::print(table,
             "device: {} ({}); {} timed steps per path after an untimed one, cold L2 "
             "before each\n{}.\nshared inputs: {}\n\n",
             info.device, info.target, f.steps, kCounted, FormatBytes(info.shared_bytes));
  nlohmann::json paths = nlohmann::json::array(), agreement = nlohmann::json::array();
  const bool all_fit = ReportPaths(table, info, reports, paths);
  const bool agree = ReportAgreement(table, p, info, reports, agreement);
  if (f.json) {
    fmt::print("{}\n",
               nlohmann::json{{"model", p.model},
                              {"hidden_size", p.hidden},
                              {"vocab_size", p.vocab},
                              {"batch", p.batch},
                              {"seq", p.seq},
                              {"tokens", p.tokens()},
                              {"valid_targets", info.valid_targets},
                              {"dtype", "bf16"},
                              {"device", info.device},
                              {"target", info.target},
                              {"memory_counted", kCounted},
                              {"shared_input_bytes", info.shared_bytes},
                              {"tolerances", {{"loss_rtol", kLossRtol}, {"grad_tol", kGradTol}}},
                              {"paths", paths},
                              {"agreement", agreement},
                              {"ok", agree && all_fit}}
                   .dump(2));
  }
  if (!agree) return kExitDisagree;
  return all_fit ? 0 : kExitOutOfMemory;
}

}  // namespace
}  // namespace finetune

int main(int argc, char** argv) {
  using finetune::Flags;
  Flags f;
  std::string presets;
  for (const std::string& n : kjit::autotune::ModelPresetNames())
    presets += (presets.empty() ? "" : ", ") + n;
  CLI::App app{
      "finetune_step: the last layers of a LLaMA-style fine-tuning step (final RMSNorm, "
      "lm_head, cross-entropy, backward) as an eager framework runs them and with kjit: "
      "step time, peak device memory and agreement",
      "finetune_step"};
  app.add_option("--batch", f.batch, "Sequences per step")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  app.add_option("--seq", f.seq, "Tokens per sequence (the last one has no target)")
      ->check(CLI::Range(2, 1 << 24))
      ->capture_default_str();
  app.add_option("--model", f.model, "A built-in model (default llama-3.1-8b): " + presets);
  app.add_option("--config", f.config,
                 "A Hugging Face config.json (hidden_size, vocab_size, rms_norm_eps)");
  app.add_option("--steps", f.steps, "Timed steps per path (the median is reported)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--chunk-rows", f.chunk_rows, "Rows per chunk of the chunked kjit path")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31))
      ->capture_default_str();
  app.add_flag("--json", f.json, "Print a JSON report on stdout (the table goes to stderr)");
  app.add_option("--trace", f.trace,
                 "Write a Chrome trace (compiles, loads, each path) to FILE at exit; as KJIT_TRACE")
      ->type_name("FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : finetune::kExitUsage;
  }
  if (absl::Status s = finetune::CheckFlags(f); !s.ok()) {
    fmt::print(stderr, "finetune_step: {}\n", kjit::ToStd(s.message()));
    return finetune::kExitUsage;
  }
  auto problem = finetune::ProblemFromFlags(f);
  if (!problem.ok()) {
    fmt::print(stderr, "finetune_step: {}\n", kjit::ToStd(problem.status().message()));
    // An unknown preset is a usage error, like CLI11's own; a config file that does not serve is
    // a failure.
    return f.config.empty() ? finetune::kExitUsage : 1;
  }
  if (!f.trace.empty()) kjit::jit::StartTraceFile(f.trace);
  if (auto driver = kjit::jit::Driver::Get(); !driver.ok()) {
    fmt::print(stderr, "finetune_step: skipped: this example needs a GPU: {}\n",
               kjit::ToStd(driver.status().message()));
    return finetune::kExitNoGpu;
  }
  return finetune::Run(f, *problem);
}
