#include "ops/rms_norm/tuning/trial.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "kjit/host_convert.h"
#include "ops/common/parallel.h"

namespace kjit::ops {

struct RmsNormTrial::Buffers {
  DeviceBuffer x, w, dy, residual, y, residual_out, rstd, dx, dw;
  std::optional<DeviceBuffer> workspace;
};

namespace {

// Rows of the reference are computed a block at a time, a block per core: every row counts towards
// dw, but only the sampled rows are kept, and 16384 x 4096 in doubles whole is 512 MB a tensor
// (1.5 s of a core for the reference alone). A block is about 2^20 elements (256 rows of 4096), so
// that a core's block holds ~8 MB a tensor at any hidden size.
constexpr int64_t kReferenceBlockElements = int64_t{1} << 20;

// Appends the rows of `v` ([n, width], the trial's rows first..first+n) that `sample` holds.
template <typename T>
void AppendSampled(std::vector<T>& out, const std::vector<T>& v, int64_t width, int64_t first,
                   const std::vector<int64_t>& sample) {
  if (v.empty()) return;
  const int64_t n = static_cast<int64_t>(v.size()) / width;
  for (int64_t r : sample) {
    if (r >= first && r < first + n) {
      out.insert(out.end(), v.begin() + (r - first) * width, v.begin() + (r - first + 1) * width);
    }
  }
}

template <typename T>
void AddTo(std::vector<T>& sum, const std::vector<T>& v) {
  if (sum.empty()) sum.assign(v.size(), T{});
  for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
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
  t->b_.reset(new Buffers{std::move(x), std::move(w), std::move(dy), std::move(residual),
                          std::move(y), std::move(residual_out), std::move(rstd), std::move(dx),
                          std::move(dw), std::nullopt});
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> hw, DownloadValues(t->b_->w, wdtype));

  t->math_ = {.hidden = hidden,
              .dtype = dtype,
              .eps = spec.eps,
              .weight_offset = spec.weight_offset,
              .casting = spec.casting};
  t->sample_ = SampleRows(rows);
  const bool none = spec.casting == RmsNormCasting::kNone;
  // Casting none: the kernel's rstd may be one ulp from the reference's (reference.h): Check
  // recomputes y with it from the sampled rows and gives the backward the reference's rstd, which
  // the dx and dw references used.
  NoneCheck none_check{.w = hw};
  const int64_t row_bytes = hidden * static_cast<int64_t>(SizeOf(dtype));
  const int64_t block_rows = std::max<int64_t>(1, kReferenceBlockElements / hidden);
  const int64_t blocks = (rows + block_rows - 1) / block_rows;
  // A group of blocks, one per core, is downloaded at once (in this thread, which holds the
  // context) and then computed in parallel; the results are kept in row order.
  const int64_t group = HostCores();
  for (int64_t group_first = 0; group_first < blocks; group_first += group) {
    const int64_t first_row = group_first * block_rows;
    const int64_t group_rows = std::min(group * block_rows, rows - first_row);
    std::vector<std::vector<unsigned char>> raw;  // x, dy, residual
    for (const DeviceBuffer* b : {&t->b_->x, &t->b_->dy, &t->b_->residual}) {
      if (b->size() == 0) break;  // no residual
      raw.emplace_back(group_rows * row_bytes);
      KJIT_RETURN_IF_ERROR(
          b->Download(raw.back().data(), raw.back().size(), first_row * row_bytes));
    }
    struct Block {
      int64_t first = 0;
      std::vector<double> x, residual;
      RmsNormForwardResult f;
      RmsNormBackwardResult b;
    };
    std::vector<Block> done((group_rows + block_rows - 1) / block_rows);
    ForEachIndex(static_cast<int64_t>(done.size()), block_rows * hidden, [&](int64_t i) {
      Block& k = done[i];
      const int64_t offset = i * block_rows;
      const int64_t n = std::min(block_rows, group_rows - offset);
      auto values = [&](const std::vector<unsigned char>& bytes) {
        return Decode(std::vector<unsigned char>(bytes.begin() + offset * row_bytes,
                                                 bytes.begin() + (offset + n) * row_bytes),
                      dtype);
      };
      k.first = first_row + offset;
      k.x = values(raw[0]);
      if (spec.fused_residual) k.residual = values(raw[2]);
      k.f = RmsNormForwardReference(t->math_, n, k.x, spec.fused_residual ? &k.residual : nullptr,
                                    hw);
      // The backward normalizes what the forward did: residual_out when fused.
      k.b = RmsNormBackwardReference(t->math_, n, values(raw[1]),
                                     spec.fused_residual ? k.f.residual_out : k.x, hw, nullptr);
    });
    const std::vector<int64_t>& sample = t->sample_;
    for (const Block& k : done) {
      AppendSampled(t->ref_f_.y, k.f.y, hidden, k.first, sample);
      AppendSampled(t->ref_f_.rstd, k.f.rstd, 1, k.first, sample);
      AppendSampled(t->ref_f_.rstd_lo, k.f.rstd_lo, 1, k.first, sample);
      AppendSampled(t->ref_f_.rstd_hi, k.f.rstd_hi, 1, k.first, sample);
      AppendSampled(t->ref_f_.residual_out, k.f.residual_out, hidden, k.first, sample);
      AppendSampled(t->ref_b_.dx, k.b.dx, hidden, k.first, sample);
      AppendSampled(t->ref_b_.dx_scale, k.b.dx_scale, hidden, k.first, sample);
      AddTo(t->ref_b_.dw, k.b.dw);
      AddTo(t->ref_b_.dw_abs, k.b.dw_abs);
      if (none) {
        AppendSampled(none_check.x, k.x, hidden, k.first, sample);
        AppendSampled(none_check.residual, k.residual, hidden, k.first, sample);
        none_check.rstd.insert(none_check.rstd.end(), k.f.rstd.begin(), k.f.rstd.end());
      }
    }
  }
  if (none) t->none_ = std::move(none_check);
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

absl::Status RmsNormTrial::Check(const RmsNorm& op, Pass pass) {
  const bool backward = pass != Pass::kForward;
  // Every output poisoned first (NaN): an unwritten element fails.
  for (const DeviceBuffer* b : {&b_->y, &b_->rstd, &b_->dx, &b_->dw}) {
    KJIT_RETURN_IF_ERROR(b->Fill(0xFF));
  }
  if (spec_.fused_residual) KJIT_RETURN_IF_ERROR(b_->residual_out.Fill(0xFF));
  KJIT_ASSIGN_OR_RETURN(const RmsNormForwardArgs f, ForwardArgs());
  KJIT_RETURN_IF_ERROR(op.Forward(nullptr, f));
  const DType dtype = spec_.dtype, wdtype = spec_.weight_dtype.value_or(dtype);
  const int64_t hidden = spec_.hidden;
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> y, SampledRows(b_->y, dtype, hidden, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> rstd,
                        SampledRows(b_->rstd, DType::kF32, 1, sample_));
  std::vector<double> residual_out;
  if (spec_.fused_residual) {
    KJIT_ASSIGN_OR_RETURN(residual_out, SampledRows(b_->residual_out, dtype, hidden, sample_));
  }
  RmsNormForwardResult none_ref_f;
  if (none_) {
    none_ref_f =
        RmsNormForwardReference(math_, static_cast<int64_t>(sample_.size()), none_->x,
                                spec_.fused_residual ? &none_->residual : nullptr, none_->w, &rstd);
  }
  std::vector<double> dx, dw;
  if (backward) {
    // The backward (a pass of its own when tuned) is checked from the forward's outputs; with
    // casting none, from the reference's rstd, which the dx and dw references used.
    if (none_) {
      KJIT_RETURN_IF_ERROR(b_->rstd.Upload(none_->rstd.data(), none_->rstd.size() * sizeof(float)));
    }
    KJIT_ASSIGN_OR_RETURN(const RmsNormBackwardArgs b, BackwardArgs(op));
    KJIT_RETURN_IF_ERROR(op.Backward(nullptr, b));
    KJIT_ASSIGN_OR_RETURN(dx, SampledRows(b_->dx, dtype, hidden, sample_));
    KJIT_ASSIGN_OR_RETURN(dw, DownloadValues(b_->dw, wdtype));
  }
  return Mismatches(fmt::format("rms_norm {} hidden={} rows={} {}", Name(pass), hidden, rows_,
                                op.config().ToString()),
                    CheckRmsNorm(math_, static_cast<int64_t>(sample_.size()), wdtype,
                                 {.y = &y,
                                  .rstd = &rstd,
                                  .residual_out = spec_.fused_residual ? &residual_out : nullptr,
                                  .dx = backward ? &dx : nullptr,
                                  .dw = backward ? &dw : nullptr},
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
