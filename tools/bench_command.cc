// `kjit bench`: time kjit's kernels on the GPU, checked against the fp64 reference first, and
// report effective bandwidth as a ratio to a device-to-device copy measured in the same run.
//
// Timing is autotune::GpuTimer's: a cold L2 before each repeat, CUDA events, the median and the
// 10th/90th percentiles.
#include <algorithm>
#include <fstream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autotune/compare.h"
#include "autotune/gpu_timer.h"
#include "autotune/host_convert.h"
#include "autotune/rms_norm_reference.h"
#include "runtime/device_buffer.h"
#include "runtime/kjit.h"
#include "tools/commands.h"
#include "tools/targets.h"

namespace kjit::tools {

namespace {

struct BenchFlags {
  std::string op = "rms_norm";
  int64_t hidden = 0;
  int64_t rows = 0;
  std::string dtype = "bf16";
  int repeats = 100;
  bool json = false;
  bool sweep = false;
  std::string output;
};

using autotune::GpuTimer;
using autotune::Timing;

absl::StatusOr<DeviceBuffer> Upload(const Runtime& rt, const std::vector<double>& v, DType t) {
  const std::vector<unsigned char> bytes = autotune::Encode(v, t);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes.size()));
  KJIT_RETURN_IF_ERROR(b.Upload(bytes.data(), bytes.size()));
  return b;
}

absl::StatusOr<std::vector<double>> Download(const DeviceBuffer& b, DType t) {
  std::vector<unsigned char> bytes(b.size());
  KJIT_RETURN_IF_ERROR(b.Download(bytes.data(), bytes.size()));
  return autotune::Decode(bytes, t);
}

absl::StatusOr<Timing> TimeCopy(const Runtime& rt, GpuTimer& timer, size_t bytes, int repeats) {
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Create(rt, bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Create(rt, bytes));
  KJIT_RETURN_IF_ERROR(src.Fill(1));
  const jit::Driver& cu = *rt.driver();
  return timer.Time(repeats, [&] {
    return cu.Check(cu.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst.data()),
                                         reinterpret_cast<CUdeviceptr>(src.data()), bytes, nullptr),
                    "cuMemcpyDtoDAsync");
  });
}

// Times one RMSNorm shape under each config (nullopt: the heuristic's), each checked against the
// fp64 reference first. Returns one JSON entry per config and pass.
absl::StatusOr<nlohmann::json> BenchRmsNorm(
    const Runtime& rt, GpuTimer& timer, DType dtype, int64_t hidden, int64_t rows, int repeats,
    double copy_gbps, const std::vector<std::optional<autotune::RmsNormConfig>>& configs) {
  std::mt19937_64 rng(std::random_device{}());
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](int64_t n, double scale, double offset) {
    std::vector<double> v(n);
    for (double& e : v) e = autotune::RoundTo(offset + scale * normal(rng), dtype);
    return v;
  };
  const std::vector<double> x = random(rows * hidden, 1.0, 0.0);
  const std::vector<double> w = random(hidden, 0.1, 1.0);
  const std::vector<double> dy = random(rows * hidden, 1.0, 0.0);
  const autotune::RmsNormMath math{.hidden = hidden, .dtype = dtype, .eps = 1e-6};
  const auto ref_f = autotune::RmsNormForwardReference(math, rows, x, nullptr, w);
  const auto ref_b = autotune::RmsNormBackwardReference(math, rows, dy, x, w, nullptr);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dx_buf, Upload(rt, x, dtype));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dw_buf, Upload(rt, w, dtype));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer ddy_buf, Upload(rt, dy, dtype));
  const size_t tensor_bytes = rows * hidden * SizeOf(dtype);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer y_buf, DeviceBuffer::Create(rt, tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer grad_buf, DeviceBuffer::Create(rt, tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer rstd_buf, DeviceBuffer::Create(rt, rows * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dweight_buf, DeviceBuffer::Create(rt, hidden * SizeOf(dtype)));
  const RmsNormForwardArgs fwd{.x = TensorView::Matrix(dx_buf.data(), dtype, rows, hidden),
                               .weight = TensorView::Vector(dw_buf.data(), dtype, hidden),
                               .y = TensorView::Matrix(y_buf.data(), dtype, rows, hidden),
                               .rstd = TensorView::Vector(rstd_buf.data(), DType::kF32, rows)};
  // Fewest bytes: forward reads x, writes y and rstd; backward reads dy, x, rstd, writes dx
  // (the weight and its gradient are counted, the fp32 partials are not).
  const double elems = static_cast<double>(rows) * hidden * SizeOf(dtype);
  const double fwd_bytes = 2 * elems + rows * 4.0 + hidden * SizeOf(dtype);
  const double bwd_bytes = 3 * elems + rows * 4.0 + 2 * hidden * SizeOf(dtype);

  nlohmann::json entries = nlohmann::json::array();
  for (const auto& config : configs) {
    RmsNormSpec spec{.hidden = hidden, .dtype = dtype};
    spec.config = config;
    KJIT_ASSIGN_OR_RETURN(RmsNorm norm, rt.RmsNorm(spec));
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer ws, DeviceBuffer::Create(rt, norm.BackwardWorkspaceBytes(rows)));
    const RmsNormBackwardArgs bwd{.dy = TensorView::Matrix(ddy_buf.data(), dtype, rows, hidden),
                                  .x = fwd.x,
                                  .weight = fwd.weight,
                                  .rstd = fwd.rstd,
                                  .dx = TensorView::Matrix(grad_buf.data(), dtype, rows, hidden),
                                  .dw = TensorView::Vector(dweight_buf.data(), dtype, hidden),
                                  .workspace = ws.data(),
                                  .workspace_bytes = static_cast<int64_t>(ws.size())};
    // Check before timing, with every output poisoned first (NaN: an unwritten element fails).
    for (const DeviceBuffer* b : {&y_buf, &grad_buf, &rstd_buf, &dweight_buf}) {
      KJIT_RETURN_IF_ERROR(b->Fill(0xFF));
    }
    KJIT_RETURN_IF_ERROR(norm.Forward(nullptr, fwd));
    KJIT_RETURN_IF_ERROR(norm.Backward(nullptr, bwd));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> y, Download(y_buf, dtype));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> rstd, Download(rstd_buf, DType::kF32));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> dx, Download(grad_buf, dtype));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> dw, Download(dweight_buf, dtype));
    std::string problems;
    for (const auto& [name, r] : autotune::CheckRmsNorm(
             math, rows, dtype, {.y = &y, .rstd = &rstd, .dx = &dx, .dw = &dw}, ref_f, &ref_b)) {
      if (!r.ok) problems += "\n  " + r.Describe(name);
    }
    if (!problems.empty()) {
      return absl::InternalError(fmt::format("rms_norm hidden={} rows={} {}: wrong results:{}",
                                             hidden, rows, norm.config().ToString(), problems));
    }
    KJIT_ASSIGN_OR_RETURN(Timing t_fwd, timer.Time(repeats, [&] { return norm.Forward(nullptr, fwd); }));
    KJIT_ASSIGN_OR_RETURN(Timing t_bwd, timer.Time(repeats, [&] { return norm.Backward(nullptr, bwd); }));
    KJIT_ASSIGN_OR_RETURN(Timing t_both, timer.Time(repeats, [&] {
      KJIT_RETURN_IF_ERROR(norm.Forward(nullptr, fwd));
      return norm.Backward(nullptr, bwd);
    }));
    auto entry = [&](const char* pass, const Timing& t, double bytes) {
      const double gbps = bytes / (t.median_us * 1e3);
      return nlohmann::json{{"op", "rms_norm"},         {"pass", pass},
                            {"dtype", Name(dtype)},     {"hidden", hidden},
                            {"rows", rows},             {"config", norm.config().ToString()},
                            {"heuristic", !config.has_value()},
                            {"median_us", t.median_us}, {"p10_us", t.p10_us},
                            {"p90_us", t.p90_us},       {"bytes", bytes},
                            {"gbps", gbps},             {"ratio_to_copy", gbps / copy_gbps},
                            {"checked", true}};
    };
    entries.push_back(entry("forward", t_fwd, fwd_bytes));
    entries.push_back(entry("backward", t_bwd, bwd_bytes));
    entries.push_back(entry("forward_backward", t_both, fwd_bytes + bwd_bytes));
  }
  return entries;
}

// The heuristic's config, then (when sweeping) every forward row shape with the heuristic's
// backward and every backward row shape with the heuristic's forward.
std::vector<std::optional<autotune::RmsNormConfig>> RmsNormConfigs(DType dtype, int64_t hidden,
                                                                    bool sweep) {
  std::vector<std::optional<autotune::RmsNormConfig>> out = {std::nullopt};
  if (!sweep) return out;
  const int vec = autotune::MaxVecForHidden(hidden, static_cast<int>(SizeOf(dtype)));
  const autotune::RmsNormConfig base = autotune::DefaultRmsNormConfig(hidden, vec);
  for (const autotune::RowShape& s : autotune::RowShapeCandidates(hidden, vec)) {
    autotune::RmsNormConfig f = base, b = base;
    f.forward = s;
    b.backward = s;
    if (!(f == base)) out.push_back(f);
    if (!(b == base)) out.push_back(b);
  }
  return out;
}

int RunBench(const BenchFlags& f) {
  auto dtype = ParseDType(f.dtype);
  if (!dtype.ok()) return Fail(dtype.status());
  auto rt = Runtime::Create();
  if (!rt.ok()) return Fail(rt.status());
  auto timer = GpuTimer::Create(rt->jit(), *rt->driver(), rt->context(), rt->target());
  if (!timer.ok()) return Fail(timer.status());
  const size_t copy_bytes = size_t{1} << 30;
  auto copy = TimeCopy(*rt, **timer, copy_bytes, f.repeats);
  if (!copy.ok()) return Fail(copy.status());
  const double copy_gbps = 2.0 * copy_bytes / (copy->median_us * 1e3);

  std::vector<std::pair<int64_t, int64_t>> shapes;  // (hidden, rows)
  if (f.hidden > 0 || f.rows > 0) {
    shapes.emplace_back(f.hidden > 0 ? f.hidden : 4096, f.rows > 0 ? f.rows : 16384);
  } else {
    shapes = {{4096, 16384}, {1024, 16384}, {4096, 256}, {8192, 16384}};
  }
  nlohmann::json results = nlohmann::json::array();
  for (auto [hidden, rows] : shapes) {
    auto r = BenchRmsNorm(*rt, **timer, *dtype, hidden, rows, f.repeats, copy_gbps,
                          RmsNormConfigs(*dtype, hidden, f.sweep));
    if (!r.ok()) return Fail(r.status());
    for (auto& e : *r) results.push_back(e);
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
    fmt::print("{:<9} {:<17} {:>6} {:>6} {:>10} {:>10} {:>8}  {}\n", "op", "pass", "hidden",
               "rows", "median_us", "GB/s", "of copy", "config");
    for (const auto& e : results) {
      fmt::print("{:<9} {:<17} {:>6} {:>6} {:>10.2f} {:>10.0f} {:>7.1f}%  {}\n",
                 e["op"].get<std::string>(), e["pass"].get<std::string>(), e["hidden"].get<int64_t>(),
                 e["rows"].get<int64_t>(), e["median_us"].get<double>(), e["gbps"].get<double>(),
                 100 * e["ratio_to_copy"].get<double>(), e["config"].get<std::string>());
    }
  }
  return 0;
}

}  // namespace

Command AddBenchCommand(CLI::App& app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* cmd = app.add_subcommand(
      "bench", "Time kernels on the GPU (checked first) against the device's copy bandwidth");
  cmd->add_option("--op", f->op, "The op")->check(CLI::IsMember({"rms_norm"}))->capture_default_str();
  cmd->add_option("--hidden", f->hidden, "Hidden size (default: a standard set of shapes)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--rows", f->rows, "Rows (tokens)")->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  cmd->add_option("--dtype", f->dtype, "fp32, fp16 or bf16")->capture_default_str();
  cmd->add_option("--repeats", f->repeats, "Timed repeats per measurement")
      ->check(CLI::Range(3, 100000))
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print the report as JSON");
  cmd->add_flag("--sweep", f->sweep,
                "Also time every candidate launch shape (forward and backward separately)");
  cmd->add_option("--output", f->output, "Also write the JSON report to this file");
  return [f] { return RunBench(*f); };
}

}  // namespace kjit::tools
