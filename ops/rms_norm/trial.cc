#include "ops/rms_norm/trial.h"

#include <optional>

#include <fmt/format.h>

namespace kjit::ops {

struct RmsNormTrial::Buffers {
  DeviceBuffer x, w, dy, residual, y, residual_out, rstd, dx, dw;
  std::optional<DeviceBuffer> workspace;
};

namespace {

// The reference's per-row results for the sampled rows only; dw (a sum over all rows) stays whole.
template <typename T>
std::vector<T> Rows(const std::vector<T>& v, int64_t width, const std::vector<int64_t>& sample) {
  std::vector<T> out;
  if (v.empty()) return out;
  for (int64_t r : sample)
    out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RmsNormTrial>> RmsNormTrial::Create(const Runtime& rt,
                                                                   const RmsNormSpec& spec,
                                                                   int64_t rows) {
  std::unique_ptr<RmsNormTrial> t(new RmsNormTrial(rt));
  t->spec_ = spec;
  t->spec_.config.reset();
  t->rows_ = rows;
  const int64_t hidden = spec.hidden;
  const DType dtype = spec.dtype, wdtype = spec.weight_dtype.value_or(spec.dtype);
  const size_t tensor_bytes = rows * hidden * SizeOf(dtype);
  auto make = [&](size_t bytes) { return DeviceBuffer::Create(rt, bytes); };
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer x, make(tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer w, make(hidden * SizeOf(wdtype)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dy, make(tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer residual, make(spec.fused_residual ? tensor_bytes : 0));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer y, make(tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer residual_out, make(spec.fused_residual ? tensor_bytes : 0));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer rstd, make(rows * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dx, make(tensor_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dw, make(hidden * SizeOf(wdtype)));
  // Made on the device (16384 x 8192 is 134M values a tensor), then read back for the reference.
  KJIT_RETURN_IF_ERROR(RandomFill(rt, x.data(), dtype, rows, hidden, hidden, 1, -2.0f, 2.0f));
  KJIT_RETURN_IF_ERROR(RandomFill(rt, w.data(), wdtype, 1, hidden, hidden, 2, 0.8f, 1.2f));
  KJIT_RETURN_IF_ERROR(RandomFill(rt, dy.data(), dtype, rows, hidden, hidden, 3, -1.0f, 1.0f));
  if (spec.fused_residual) {
    KJIT_RETURN_IF_ERROR(
        RandomFill(rt, residual.data(), dtype, rows, hidden, hidden, 4, -2.0f, 2.0f));
  }
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> hx, DownloadValues(x, dtype));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> hw, DownloadValues(w, wdtype));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> hdy, DownloadValues(dy, dtype));
  std::vector<double> hres;
  if (spec.fused_residual) {
    KJIT_ASSIGN_OR_RETURN(hres, DownloadValues(residual, dtype));
  }
  t->b_.reset(new Buffers{std::move(x), std::move(w), std::move(dy), std::move(residual),
                          std::move(y), std::move(residual_out), std::move(rstd), std::move(dx),
                          std::move(dw), std::nullopt});

  t->math_ = {.hidden = hidden,
              .dtype = dtype,
              .eps = spec.eps,
              .weight_offset = spec.weight_offset,
              .casting = spec.casting};
  RmsNormForwardResult f =
      RmsNormForwardReference(t->math_, rows, hx, spec.fused_residual ? &hres : nullptr, hw);
  // The backward normalizes what the forward did: residual_out when fused.
  RmsNormBackwardResult b = RmsNormBackwardReference(
      t->math_, rows, hdy, spec.fused_residual ? f.residual_out : hx, hw, nullptr);
  t->sample_ = SampleRows(rows);
  t->ref_f_ = {.y = Rows(f.y, hidden, t->sample_),
               .rstd = Rows(f.rstd, 1, t->sample_),
               .rstd_lo = Rows(f.rstd_lo, 1, t->sample_),
               .rstd_hi = Rows(f.rstd_hi, 1, t->sample_),
               .residual_out = Rows(f.residual_out, hidden, t->sample_)};
  if (spec.casting == RmsNormCasting::kNone) {
    // The kernel's rstd may be one ulp from the reference's (reference.h): Check recomputes y with
    // it from these rows and gives the backward the reference's rstd, which the dx and dw
    // references used.
    t->none_ = NoneCheck{.x = Rows(hx, hidden, t->sample_),
                         .residual = Rows(hres, hidden, t->sample_),
                         .w = hw,
                         .rstd = std::vector<float>(f.rstd.begin(), f.rstd.end())};
  }
  t->ref_b_ = {Rows(b.dx, hidden, t->sample_), std::move(b.dw), std::move(b.dw_abs),
               Rows(b.dx_scale, hidden, t->sample_)};
  return t;
}

RmsNormTrial::RmsNormTrial(const Runtime& rt) : rt_(rt) {}
RmsNormTrial::~RmsNormTrial() = default;

absl::StatusOr<RmsNormForwardArgs> RmsNormTrial::ForwardArgs() const {
  const DType dtype = spec_.dtype;
  const int64_t hidden = spec_.hidden;
  RmsNormForwardArgs a{
      .x = TensorView::Matrix(b_->x.data(), dtype, rows_, hidden),
      .weight = TensorView::Vector(b_->w.data(), spec_.weight_dtype.value_or(dtype), hidden),
      .y = TensorView::Matrix(b_->y.data(), dtype, rows_, hidden),
      .rstd = TensorView::Vector(b_->rstd.data(), DType::kF32, rows_)};
  if (spec_.fused_residual) {
    a.residual = TensorView::Matrix(b_->residual.data(), dtype, rows_, hidden);
    a.residual_out = TensorView::Matrix(b_->residual_out.data(), dtype, rows_, hidden);
  }
  return a;
}

absl::StatusOr<RmsNormBackwardArgs> RmsNormTrial::BackwardArgs(const RmsNorm& op) {
  const int64_t needed = op.BackwardWorkspaceBytes(rows_);
  if (!b_->workspace || static_cast<int64_t>(b_->workspace->size()) < needed) {
    b_->workspace.reset();
    KJIT_ASSIGN_OR_RETURN(b_->workspace, DeviceBuffer::Create(rt_, needed));
  }
  KJIT_ASSIGN_OR_RETURN(const RmsNormForwardArgs f, ForwardArgs());
  return RmsNormBackwardArgs{
      .dy = TensorView::Matrix(b_->dy.data(), spec_.dtype, rows_, spec_.hidden),
      .x = spec_.fused_residual ? f.residual_out : f.x,
      .weight = f.weight,
      .rstd = f.rstd,
      .dx = TensorView::Matrix(b_->dx.data(), spec_.dtype, rows_, spec_.hidden),
      .dw =
          TensorView::Vector(b_->dw.data(), spec_.weight_dtype.value_or(spec_.dtype), spec_.hidden),
      .workspace = b_->workspace->data(),
      .workspace_bytes = static_cast<int64_t>(b_->workspace->size())};
}

absl::Status RmsNormTrial::Check(const RmsNorm& op) {
  // Every output poisoned first (NaN): an unwritten element fails.
  for (const DeviceBuffer* b : {&b_->y, &b_->rstd, &b_->dx, &b_->dw}) {
    KJIT_RETURN_IF_ERROR(b->Fill(0xFF));
  }
  if (spec_.fused_residual) KJIT_RETURN_IF_ERROR(b_->residual_out.Fill(0xFF));
  KJIT_ASSIGN_OR_RETURN(const RmsNormForwardArgs f, ForwardArgs());
  KJIT_ASSIGN_OR_RETURN(const RmsNormBackwardArgs b, BackwardArgs(op));
  KJIT_RETURN_IF_ERROR(op.Forward(nullptr, f));
  const DType dtype = spec_.dtype, wdtype = spec_.weight_dtype.value_or(dtype);
  const int64_t hidden = spec_.hidden;
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> y, SampledRows(b_->y, dtype, hidden, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> rstd,
                        SampledRows(b_->rstd, DType::kF32, 1, sample_));
  RmsNormForwardResult none_ref_f;
  if (none_) {
    KJIT_RETURN_IF_ERROR(b_->rstd.Upload(none_->rstd.data(), none_->rstd.size() * sizeof(float)));
    none_ref_f =
        RmsNormForwardReference(math_, static_cast<int64_t>(sample_.size()), none_->x,
                                spec_.fused_residual ? &none_->residual : nullptr, none_->w, &rstd);
  }
  KJIT_RETURN_IF_ERROR(op.Backward(nullptr, b));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> dx, SampledRows(b_->dx, dtype, hidden, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> dw, DownloadValues(b_->dw, wdtype));
  std::vector<double> residual_out;
  if (spec_.fused_residual) {
    KJIT_ASSIGN_OR_RETURN(residual_out, SampledRows(b_->residual_out, dtype, hidden, sample_));
  }
  return Mismatches(
      fmt::format("rms_norm hidden={} rows={} {}", hidden, rows_, op.config().ToString()),
      CheckRmsNorm(math_, static_cast<int64_t>(sample_.size()), wdtype,
                   {.y = &y,
                    .rstd = &rstd,
                    .residual_out = spec_.fused_residual ? &residual_out : nullptr,
                    .dx = &dx,
                    .dw = &dw},
                   none_ ? none_ref_f : ref_f_, &ref_b_));
}

absl::StatusOr<TimedWork> RmsNormTrial::Work(const RmsNorm& op, Pass pass) {
  KJIT_ASSIGN_OR_RETURN(const RmsNormForwardArgs f, ForwardArgs());
  KJIT_ASSIGN_OR_RETURN(const RmsNormBackwardArgs b, BackwardArgs(op));
  return TimedWork{[&op, pass, f, b]() -> absl::Status {
                     if (pass != Pass::kBackward) KJIT_RETURN_IF_ERROR(op.Forward(nullptr, f));
                     if (pass != Pass::kForward) KJIT_RETURN_IF_ERROR(op.Backward(nullptr, b));
                     return absl::OkStatus();
                   },
                   nullptr};
}

double RmsNormTrial::Bytes(Pass pass) const {
  // Fewest bytes: forward reads x (and the residual), writes y (and residual_out) and rstd;
  // backward reads dy, x and rstd and writes dx. The weight and its gradient count, the fp32
  // partials do not.
  const double tensor = static_cast<double>(rows_) * spec_.hidden * SizeOf(spec_.dtype);
  const double weight = spec_.hidden * SizeOf(spec_.weight_dtype.value_or(spec_.dtype));
  const double forward = (spec_.fused_residual ? 4 : 2) * tensor + rows_ * 4.0 + weight;
  const double backward = 3 * tensor + rows_ * 4.0 + 2 * weight;
  switch (pass) {
    case Pass::kForward: return forward;
    case Pass::kBackward: return backward;
    case Pass::kForwardBackward: return forward + backward;
  }
  return 0;
}

}  // namespace kjit::ops
