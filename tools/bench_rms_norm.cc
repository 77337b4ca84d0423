// `kjit bench --op rms_norm`: RMSNorm forward, backward and both, checked against the fp64 reference
// before timing, optionally over every candidate launch shape (--sweep).
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "autotune/host_convert.h"
#include "autotune/rms_norm_reference.h"
#include "tools/bench.h"

namespace kjit::tools {

// Times one RMSNorm shape under each config (nullopt: the heuristic's), each checked against the
// fp64 reference first. Returns one JSON entry per config and pass.
absl::StatusOr<nlohmann::json> BenchRmsNorm(
    const Runtime& rt, autotune::GpuTimer& timer, DType dtype, int64_t hidden, int64_t rows, int repeats,
    double copy_gbps, const std::vector<std::optional<autotune::RmsNormConfig>>& configs) {
  std::mt19937_64 rng(std::random_device{}());
  const std::vector<double> x = autotune::RandomValues(rng, rows * hidden, 1.0, 0.0, dtype);
  const std::vector<double> w = autotune::RandomValues(rng, hidden, 0.1, 1.0, dtype);
  const std::vector<double> dy = autotune::RandomValues(rng, rows * hidden, 1.0, 0.0, dtype);
  const autotune::RmsNormMath math{.hidden = hidden, .dtype = dtype, .eps = 1e-6};
  const auto ref_f = autotune::RmsNormForwardReference(math, rows, x, nullptr, w);
  const auto ref_b = autotune::RmsNormBackwardReference(math, rows, dy, x, w, nullptr);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dx_buf, UploadValues(rt, x, dtype));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dw_buf, UploadValues(rt, w, dtype));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer ddy_buf, UploadValues(rt, dy, dtype));
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
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> y, DownloadValues(y_buf, dtype));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> rstd, DownloadValues(rstd_buf, DType::kF32));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> dx, DownloadValues(grad_buf, dtype));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> dw, DownloadValues(dweight_buf, dtype));
    std::string problems;
    for (const auto& [name, r] : autotune::CheckRmsNorm(
             math, rows, dtype, {.y = &y, .rstd = &rstd, .dx = &dx, .dw = &dw}, ref_f, &ref_b)) {
      if (!r.ok) problems += "\n  " + r.Describe(name);
    }
    if (!problems.empty()) {
      return absl::InternalError(fmt::format("rms_norm hidden={} rows={} {}: wrong results:{}",
                                             hidden, rows, norm.config().ToString(), problems));
    }
    KJIT_ASSIGN_OR_RETURN(autotune::Timing t_fwd, timer.Time(repeats, [&] { return norm.Forward(nullptr, fwd); }));
    KJIT_ASSIGN_OR_RETURN(autotune::Timing t_bwd, timer.Time(repeats, [&] { return norm.Backward(nullptr, bwd); }));
    KJIT_ASSIGN_OR_RETURN(autotune::Timing t_both, timer.Time(repeats, [&] {
      KJIT_RETURN_IF_ERROR(norm.Forward(nullptr, fwd));
      return norm.Backward(nullptr, bwd);
    }));
    auto entry = [&](const char* pass, const autotune::Timing& t, double bytes) {
      return BenchEntry({.op = "rms_norm", .pass = pass,
                         .shape = fmt::format("hidden={} rows={}", hidden, rows),
                         .config = norm.config().ToString(), .dtype = dtype,
                         .heuristic = !config.has_value(), .bytes = bytes,
                         .extra = {{"hidden", hidden}, {"rows", rows}}},
                        t, copy_gbps);
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

}  // namespace kjit::tools
