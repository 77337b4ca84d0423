// `kjit bench`: time kjit's kernels on the GPU, checked against the fp64 reference first, and
// report effective bandwidth as a ratio to a device-to-device copy measured in the same run.
//
// Timing is autotune::GpuTimer's: a cold L2 before each repeat, CUDA events, the median and the
// 10th/90th percentiles.
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jit/file_io.h"
#include "jit/json_text.h"
#include "jit/status_helpers.h"
#include "ops/registry.h"
#include "runtime/runtime_state.h"
#include "tools/bench.h"
#include "tools/bench_linear_cross_entropy.h"
#include "tools/commands.h"
#include "tools/op_flags.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct BenchFlags {
  std::string op = ops::OpNames().front();  // the registry's first
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t rows = 0;
  std::string dtype = "bf16";
  // The ops' own flags (--casting, --class-weights: OpTrait::Flags).
  OpFlagOptions op_flags{ops::FlagCommand::kBench};
  int repeats = 100;
  int device = 0;
  bool json = false;
  bool sweep = false;
  std::vector<std::string> configs;
  std::string output;
};

using autotune::GpuTimer;
using autotune::Timing;

// Times one problem (an op at a shape and row count) under each config ("": the op's own choice
// at this row count, tuned or heuristic), each checked against the fp64 reference first.
absl::StatusOr<nlohmann::json> BenchProblem(const Runtime& rt, GpuTimer& timer,
                                            const ops::OpSpec& spec, int64_t rows, int repeats,
                                            double copy_gbps,
                                            const std::vector<std::string>& configs) {
  KJIT_ASSIGN_OR_RETURN(std::unique_ptr<ops::AnyTrial> trial, ops::MakeTrial(rt, spec, rows));
  nlohmann::json entries = nlohmann::json::array();
  for (const std::string& config : configs) {
    ops::OpSpec op = spec;
    if (!config.empty()) {
      KJIT_ASSIGN_OR_RETURN(op, ops::WithConfig(spec, config));
    }
    for (ops::Pass pass : trial->BenchPasses()) {
      KJIT_RETURN_IF_ERROR(trial->Check(op, pass));
      KJIT_ASSIGN_OR_RETURN(ops::TimedWork work, trial->Work(pass));
      KJIT_ASSIGN_OR_RETURN(Timing t, timer.Time(repeats, work.launch, work.prepare));
      const std::string used = trial->ConfigUsed(pass);
      const bool tuned = config.empty() && used != trial->OpConfig();
      nlohmann::json extra = trial->BenchFields();
      extra["tuned"] = tuned;
      entries.push_back(
          BenchEntry({.op = ops::OpName(spec),
                      .pass = ops::Name(pass),
                      .shape = fmt::format("{} rows={}", ops::TuningShape(spec), rows),
                      .config = used,
                      .dtype = ops::OpDType(spec),
                      .heuristic = config.empty() && !tuned,
                      .bytes = trial->Bytes(pass),
                      .extra = std::move(extra)},
                     t, copy_gbps));
    }
  }
  return entries;
}

// The configs to time: those --config names (CheckBenchFlags checked them against the op), else
// the op's own choice and, when sweeping, every other candidate of its search space.
absl::StatusOr<std::vector<std::string>> ConfigsFor(const Runtime& rt, const ops::OpSpec& spec,
                                                    const BenchFlags& f) {
  if (!f.configs.empty()) return f.configs;
  std::vector<std::string> out = {""};
  if (!f.sweep) return out;
  KJIT_ASSIGN_OR_RETURN(const std::string heuristic, ops::HeuristicConfig(rt, spec));
  for (const auto& [config, pruned] : ops::SearchSpace(spec, heuristic, rt.arch())) {
    if (pruned.empty() && config != heuristic) out.push_back(config);
  }
  return out;
}

// The problems to time, as (size, rows): the op's standard set, or the one the flags give.
std::vector<std::pair<int64_t, int64_t>> Shapes(const BenchFlags& f) {
  const int64_t size = ops::BenchSizeName(f.op) == "hidden" ? f.hidden : f.vocab;
  std::vector<std::pair<int64_t, int64_t>> shapes = ops::BenchShapes(f.op);
  if (size > 0 || f.rows > 0) {
    shapes = {
        {size > 0 ? size : shapes.front().first, f.rows > 0 ? f.rows : shapes.front().second}};
  }
  return shapes;
}

// The op at one of the shapes, with the op's flags given applied, each validated in turn.
absl::StatusOr<ops::OpSpec> SpecFor(const BenchFlags& f, int64_t size, DType dtype) {
  KJIT_ASSIGN_OR_RETURN(ops::OpSpec spec, ops::BenchSpec(f.op, size, dtype));
  for (const auto& [flag, value] : f.op_flags.given()) {
    KJIT_RETURN_IF_ERROR(ops::ApplyFlag(spec, ops::FlagCommand::kBench, flag, value));
    KJIT_RETURN_IF_ERROR(Annotate(ops::ValidateSpec(spec), flag));
  }
  return spec;
}

// The fused lm_head + loss is timed against GEMM baselines rather than through a trial: both
// sizes apply, and its configs are its own.
constexpr const char* kLinearCrossEntropy = "linear_cross_entropy";

std::vector<LinearCrossEntropyBenchShape> LinearCrossEntropyShapes(const BenchFlags& f) {
  std::vector<LinearCrossEntropyBenchShape> shapes = LinearCrossEntropyBenchShapes();
  if (f.vocab > 0 || f.hidden > 0 || f.rows > 0) {
    const LinearCrossEntropyBenchShape first = shapes[1];  // LLaMA 3 at 8192 tokens
    shapes = {{f.vocab > 0 ? f.vocab : first.vocab, f.hidden > 0 ? f.hidden : first.hidden,
               f.rows > 0 ? f.rows : first.rows}};
  }
  return shapes;
}

// What CLI11 cannot check once it has parsed the flags, all before any GPU is looked for: --hidden
// and --vocab each size one op, and each --config is one of the op's.
absl::Status CheckBenchFlags(const BenchFlags& f, const CLI::App& cmd) {
  if (f.op == kLinearCrossEntropy) {
    if (const auto given = f.op_flags.given(); !given.empty()) {
      return absl::InvalidArgumentError(
          fmt::format("{} does not apply to --op {}", given.front().first, f.op));
    }
    KJIT_ASSIGN_OR_RETURN(const ops::OpSpec spec, ops::BenchSpec(f.op, 0, DType::kBF16));
    for (const std::string& c : f.configs) {
      KJIT_RETURN_IF_ERROR(Annotate(ops::WithConfig(spec, c).status(), "--config"));
    }
    return absl::OkStatus();
  }
  const std::string own = ops::BenchSizeName(f.op);
  for (const std::string& op : ops::OpNames()) {
    const std::string size = ops::BenchSizeName(op);
    if (size != own && cmd.count("--" + size) > 0) {
      return absl::InvalidArgumentError(fmt::format("--{} does not apply to --op {}", size, f.op));
    }
  }
  const DType dtype = ParseDType(f.dtype).value();  // checked by its validator
  for (const auto& [size, rows] : Shapes(f)) {
    KJIT_ASSIGN_OR_RETURN(const ops::OpSpec spec, SpecFor(f, size, dtype));
    for (const std::string& c : f.configs) {
      KJIT_RETURN_IF_ERROR(Annotate(ops::WithConfig(spec, c).status(), "--config"));
    }
  }
  return absl::OkStatus();
}

int RunBench(const BenchFlags& f) {
  const DType dtype = ParseDType(f.dtype).value();  // checked by its validator
  const std::vector<std::pair<int64_t, int64_t>> shapes =
      f.op == kLinearCrossEntropy ? std::vector<std::pair<int64_t, int64_t>>{} : Shapes(f);
  auto rt = RuntimeOnDevice(f.device);
  if (!rt.ok()) return Fail(rt.status());
  auto timer = GpuTimer::Create(*rt);
  if (!timer.ok()) return Fail(timer.status());
  const size_t copy_bytes = autotune::kCopyBytes;
  auto copy = autotune::TimeDeviceCopy(*rt, **timer, copy_bytes, f.repeats);
  if (!copy.ok()) return Fail(copy.status());
  const double copy_gbps = 2.0 * copy_bytes / (copy->median_us * 1e3);

  nlohmann::json results = nlohmann::json::array();
  if (f.op == kLinearCrossEntropy) {
    // Each launch is tens of milliseconds: fewer repeats keep a sweep to minutes.
    const int repeats = std::min(f.repeats, 20);
    for (const LinearCrossEntropyBenchShape& shape : LinearCrossEntropyShapes(f)) {
      auto r = BenchLinearCrossEntropy(*rt, **timer, shape, dtype, repeats, copy_gbps, f.sweep,
                                       f.configs);
      if (!r.ok()) return Fail(r.status());
      for (const auto& e : *r) results.push_back(e);
    }
  }
  for (const auto& [s, rows] : shapes) {             // none for the fused lm_head + loss
    const ops::OpSpec spec = *SpecFor(f, s, dtype);  // checked by CheckBenchFlags
    auto configs = ConfigsFor(*rt, spec, f);
    if (!configs.ok()) return Fail(configs.status());
    auto r = BenchProblem(*rt, **timer, spec, rows, f.repeats, copy_gbps, *configs);
    if (!r.ok()) return Fail(r.status());
    for (const auto& e : *r) results.push_back(e);
  }
  nlohmann::json report = {
      {"device", rt->device().name},
      {"target", rt->target()},
      {"driver", internal::StateOf(*rt).driver->version()},
      {"copy", {{"bytes", 2.0 * copy_bytes}, {"median_us", copy->median_us}, {"gbps", copy_gbps}}},
      {"repeats", f.repeats},
      {"l2_flushed", true},
      {"results", results}};
  if (!f.output.empty()) {
    if (absl::Status s = jit::WriteFileInPlace(f.output, jit::JsonText(report, 2) + "\n");
        !s.ok()) {
      return Fail(Annotate(s, "--output"));
    }
  }
  if (f.json) {
    fmt::print("{}\n", jit::JsonText(report, 2));
  } else {
    fmt::print("{} ({}), copy {:.0f} GB/s\n", rt->device().name, rt->target(), copy_gbps);
    if (f.op == kLinearCrossEntropy) {
      fmt::print("{:<19} {:<38} {:>10} {:>8} {:>9}  {}\n", "impl", "shape", "median_us", "TFLOP/s",
                 "of GEMMs", "config");
      for (const auto& e : results) {
        fmt::print("{:<19} {:<38} {:>10.1f} {:>8.1f} {:>9.3f}  {}\n", e["impl"].get<std::string>(),
                   e["shape"].get<std::string>(), e["median_us"].get<double>(),
                   e.value("tflops", 0.0), e.value("ratio_to_gemms", 1.0),
                   e["config"].get<std::string>());
      }
      return 0;
    }
    fmt::print("{:<13} {:<17} {:<26} {:>10} {:>10} {:>8}  {}\n", "op", "pass", "shape", "median_us",
               "GB/s", "of copy", "config");
    for (const auto& e : results) {
      fmt::print("{:<13} {:<17} {:<26} {:>10.2f} {:>10.0f} {:>7.1f}%  {}\n",
                 e["op"].get<std::string>(), e["pass"].get<std::string>(),
                 e["shape"].get<std::string>(), e["median_us"].get<double>(),
                 e["gbps"].get<double>(), 100 * e["ratio_to_copy"].get<double>(),
                 e["config"].get<std::string>());
    }
  }
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time kernels on the GPU (checked first) against the device's copy bandwidth");
  cmd->add_option("--op", f->op, "The op")
      ->check(CLI::IsMember(ops::OpNames()))
      ->capture_default_str();
  // The sizes are those of `kjit compile`, for the ops that take each.
  const std::vector<ops::CommandFlag> compile_flags = ops::CommandFlags(ops::FlagCommand::kCompile);
  const auto ops_taking = [&](std::string_view flag) {
    for (const ops::CommandFlag& c : compile_flags) {
      if (c.info.name == flag) return fmt::format("{}", fmt::join(c.ops, " and "));
    }
    return std::string();
  };
  cmd->add_option(
         "--hidden", f->hidden,
         fmt::format("Hidden size, {} (default: a standard set of shapes)", ops_taking("--hidden")))
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--vocab", f->vocab,
                  fmt::format("Vocab size, {} (default: 128256 at 3 row counts, 256000 and 151936 "
                              "at 8192, and for cross_entropy 50257 at 16384)",
                              ops_taking("--vocab")))
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--rows", f->rows, "Rows (tokens); a launch takes at most 2^31 - 1")
      ->check(CLI::Range(int64_t{1}, int64_t{std::numeric_limits<int32_t>::max()}));
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")
      ->check(DTypeValidator())
      ->capture_default_str();
  f->op_flags.AddOptions(cmd, [](const ops::FlagInfo&) { return true; });
  cmd->add_option("--repeats", f->repeats, "Timed repeats per measurement")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  cmd->add_option("--device", f->device, "The GPU to run on, by CUDA ordinal")
      ->check(CLI::Range(0, 4095))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print the report as JSON");
  cmd->add_flag(
      "--sweep", f->sweep,
      "Also time every candidate launch config (rms_norm: forward and backward shapes "
      "separately; cross_entropy: threads, unroll, cluster and staged; "
      "linear_cross_entropy: chunk rows, streams and each GEMM's cuBLASLt algorithm, in the op "
      "and alone)");
  cmd->add_option(
         "--config", f->configs,
         "Time these launch configs instead of the op's own choice, as kjit-tune prints "
         "them (repeatable), e.g. --config 'vec=8 threads=256 unroll=4 cluster=8 staged=1'")
      ->excludes(cmd->get_option("--sweep"));
  cmd->add_option("--output", f->output, "Also write the JSON report to this file");
  cmd->final_callback([f, cmd] {
    f->op_flags.Record(*cmd);
    ThrowIfUsageError(CheckBenchFlags(*f, *cmd));
  });
  return [f] { return RunBench(*f); };
}

}  // namespace kjit::tools
