// `kjit bench`: time kjit's kernels on the GPU, checked against the fp64 reference first, and
// report effective bandwidth as a ratio to a device-to-device copy measured in the same run.
//
// Timing is autotune::GpuTimer's: a cold L2 before each repeat, CUDA events, the median and the
// 10th/90th percentiles.
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/trial.h"
#include "tools/bench.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct BenchFlags {
  std::string op = "rms_norm";
  int64_t hidden = 0;
  int64_t vocab = 0;
  int64_t rows = 0;
  std::string dtype = "bf16";
  int repeats = 100;
  int device = 0;
  bool json = false;
  bool sweep = false;
  std::vector<std::string> configs;
  std::string output;
};

// The configs --config names, parsed for the op: nullopt (the op's own choice) when none is given.
template <typename Config, typename Parse>
absl::StatusOr<std::vector<std::optional<Config>>> GivenConfigs(
    const std::vector<std::string>& texts, Parse parse) {
  std::vector<std::optional<Config>> out;
  for (const std::string& t : texts) {
    absl::StatusOr<Config> c = parse(t);
    if (!c.ok()) {
      return absl::InvalidArgumentError(
          fmt::format("--config: {}", std::string(c.status().message())));
    }
    out.push_back(*c);
  }
  return out;
}

using autotune::GpuTimer;
using autotune::Timing;

int RunBench(const BenchFlags& f) {
  auto dtype = ParseDType(f.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto rms_configs = GivenConfigs<autotune::RmsNormConfig>(
      f.op == "rms_norm" ? f.configs : std::vector<std::string>{}, autotune::ParseRmsNormConfig);
  if (!rms_configs.ok()) return Fail(rms_configs.status());
  auto ce_configs = GivenConfigs<autotune::CrossEntropyConfig>(
      f.op == "cross_entropy" ? f.configs : std::vector<std::string>{},
      autotune::ParseCrossEntropyConfig);
  if (!ce_configs.ok()) return Fail(ce_configs.status());
  auto rt = RuntimeOnDevice(f.device);
  if (!rt.ok()) return Fail(rt.status());
  auto timer = GpuTimer::Create(rt->jit(), *rt->driver(), rt->context(), rt->target());
  if (!timer.ok()) return Fail(timer.status());
  const size_t copy_bytes = autotune::kCopyBytes;
  auto copy = autotune::TimeDeviceCopy(*rt, **timer, copy_bytes, f.repeats);
  if (!copy.ok()) return Fail(copy.status());
  const double copy_gbps = 2.0 * copy_bytes / (copy->median_us * 1e3);

  nlohmann::json results = nlohmann::json::array();
  auto add = [&](const absl::StatusOr<nlohmann::json>& r) {
    if (!r.ok()) return false;
    for (const auto& e : *r) results.push_back(e);
    return true;
  };
  if (f.op == "rms_norm") {
    std::vector<std::pair<int64_t, int64_t>> shapes;  // (hidden, rows)
    if (f.hidden > 0 || f.rows > 0) {
      shapes.emplace_back(f.hidden > 0 ? f.hidden : 4096, f.rows > 0 ? f.rows : 16384);
    } else {
      shapes = {{4096, 16384}, {1024, 16384}, {4096, 256}, {8192, 16384}};
    }
    for (auto [hidden, rows] : shapes) {
      auto r = BenchRmsNorm(*rt, **timer, *dtype, hidden, rows, f.repeats, copy_gbps,
                            f.configs.empty() ? RmsNormConfigs(*dtype, hidden, f.sweep)
                                              : *rms_configs);
      if (!add(r)) return Fail(r.status());
    }
  } else {
    std::vector<std::pair<int64_t, int64_t>> shapes;  // (vocab, rows)
    if (f.vocab > 0 || f.rows > 0) {
      shapes.emplace_back(f.vocab > 0 ? f.vocab : 128256, f.rows > 0 ? f.rows : 16384);
    } else {
      shapes = {{128256, 16384}, {128256, 4096}, {128256, 256}};
    }
    for (auto [vocab, rows] : shapes) {
      auto r = BenchCrossEntropy(*rt, **timer, *dtype, vocab, rows, f.repeats, copy_gbps,
                                 f.configs.empty() ? CrossEntropyConfigs(*rt, *dtype, vocab, f.sweep)
                                                   : *ce_configs);
      if (!add(r)) return Fail(r.status());
    }
  }
  nlohmann::json report = {
      {"device", rt->device().name},
      {"target", rt->target().ToString()},
      {"driver", rt->driver()->version()},
      {"copy", {{"bytes", 2.0 * copy_bytes}, {"median_us", copy->median_us}, {"gbps", copy_gbps}}},
      {"repeats", f.repeats},
      {"l2_flushed", true},
      {"results", results}};
  if (!f.output.empty()) std::ofstream(f.output) << report.dump(2) << "\n";
  if (f.json) {
    fmt::print("{}\n", report.dump(2));
  } else {
    fmt::print("{} ({}), copy {:.0f} GB/s\n", rt->device().name, rt->target().ToString(), copy_gbps);
    fmt::print("{:<13} {:<17} {:<26} {:>10} {:>10} {:>8}  {}\n", "op", "pass", "shape",
               "median_us", "GB/s", "of copy", "config");
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
      ->check(CLI::IsMember({"rms_norm", "cross_entropy"}))
      ->capture_default_str();
  cmd->add_option("--hidden", f->hidden, "Hidden size, rms_norm (default: a standard set of shapes)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--vocab", f->vocab, "Vocab size, cross_entropy (default: 128256 at 3 row counts)")
      ->check(CLI::Range(2, 1 << 20));
  cmd->add_option("--rows", f->rows, "Rows (tokens)")->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")->capture_default_str();
  cmd->add_option("--repeats", f->repeats, "Timed repeats per measurement")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  cmd->add_option("--device", f->device, "The GPU to run on, by CUDA ordinal")
      ->check(CLI::Range(0, 4095))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print the report as JSON");
  cmd->add_flag("--sweep", f->sweep,
                "Also time every candidate launch config (rms_norm: forward and backward shapes "
                "separately; cross_entropy: threads, unroll, cluster and staged)");
  cmd->add_option("--config", f->configs,
                  "Time these launch configs instead of the op's own choice, as kjit-tune prints "
                  "them (repeatable), e.g. --config 'vec=8 threads=256 unroll=4 cluster=8 staged=1'")
      ->excludes(cmd->get_option("--sweep"));
  cmd->add_option("--output", f->output, "Also write the JSON report to this file");
  return [f] { return RunBench(*f); };
}

}  // namespace kjit::tools
