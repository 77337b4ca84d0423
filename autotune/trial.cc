#include "autotune/trial.h"

#include <algorithm>

#include <fmt/format.h>

#include "autotune/host_convert.h"

namespace kjit::autotune {

const char* Name(Pass p) {
  switch (p) {
    case Pass::kForward: return "forward";
    case Pass::kBackward: return "backward";
    case Pass::kForwardBackward: return "forward_backward";
  }
  return "?";
}

namespace {

constexpr int kFillThreads = 256;
constexpr int64_t kFillBlocks = 4096;

absl::StatusOr<CUfunction> FillKernel(const Runtime& rt, const std::string& expr) {
  KJIT_ASSIGN_OR_RETURN(jit::Source src,
                        jit::RenderSource("random_fill", {"common.cuh", "random_fill.cuh"}, {expr},
                                          {{"op", "random_fill"}, {"kernel", expr}}));
  KJIT_ASSIGN_OR_RETURN(auto module, rt.jit().Load(src, rt.target(), *rt.driver(), rt.context()));
  // The Jit keeps loaded modules for the context's life, so the function outlives `module`.
  return module->Function(expr);
}

absl::Status LaunchAndSync(const Runtime& rt, CUfunction fn, void** args) {
  const jit::Driver& cu = *rt.driver();
  KJIT_RETURN_IF_ERROR(cu.Check(
      cu.cuLaunchKernel(fn, kFillBlocks, 1, 1, kFillThreads, 1, 1, 0, nullptr, args, nullptr),
      "cuLaunchKernel(random_fill)"));
  return cu.Check(cu.cuCtxSynchronize(), "cuCtxSynchronize");
}

absl::Status RandomTargets(const Runtime& rt, void* data, IndexType type, int64_t rows,
                           uint64_t seed, int64_t modulus) {
  KJIT_ASSIGN_OR_RETURN(
      CUfunction fn,
      FillKernel(rt, fmt::format("kjit::random_targets<{}>",
                                 type == IndexType::kInt32 ? "int" : "long long")));
  long long n = rows, m = modulus;
  unsigned long long s = seed;
  void* args[] = {&data, &n, &s, &m};
  return LaunchAndSync(rt, fn, args);
}

absl::Status CopyDevice(const Runtime& rt, const DeviceBuffer& dst, const DeviceBuffer& src) {
  const jit::Driver& cu = *rt.driver();
  return cu.Check(cu.cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst.data()),
                                       reinterpret_cast<CUdeviceptr>(src.data()), src.size(),
                                       nullptr),
                  "cuMemcpyDtoDAsync");
}

// Every mismatch, one per line, or OK.
absl::Status Mismatches(const std::string& what,
                        const std::vector<std::pair<std::string, CompareResult>>& results) {
  std::string problems;
  for (const auto& [name, r] : results) {
    if (!r.ok) problems += "\n  " + r.Describe(name);
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InternalError(fmt::format("{}: wrong results:{}", what, problems));
}

// The rows a trial checks: the first and last 16 (the edges of the grid), and 32 between.
std::vector<int64_t> SampleRows(int64_t rows) {
  std::vector<int64_t> out;
  const int64_t stride = std::max<int64_t>(1, rows / 32);
  for (int64_t r = 0; r < rows; ++r) {
    if (r < 16 || r >= rows - 16 || r % stride == stride / 2) out.push_back(r);
  }
  return out;
}

}  // namespace

absl::Status RandomFill(const Runtime& rt, void* data, DType dtype, int64_t rows, int64_t cols,
                        int64_t row_stride, uint64_t seed, float lo, float hi) {
  KJIT_ASSIGN_OR_RETURN(
      CUfunction fn, FillKernel(rt, fmt::format("kjit::random_fill<{}>", DeviceTypeName(dtype))));
  long long r = rows, c = cols, stride = row_stride;
  unsigned long long s = seed;
  void* args[] = {&data, &r, &c, &stride, &s, &lo, &hi};
  return LaunchAndSync(rt, fn, args);
}

absl::StatusOr<Timing> TimeDeviceCopy(const Runtime& rt, GpuTimer& timer, size_t bytes,
                                      int repeats) {
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer src, DeviceBuffer::Create(rt, bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer dst, DeviceBuffer::Create(rt, bytes));
  KJIT_RETURN_IF_ERROR(src.Fill(1));
  return timer.Time(repeats, [&] { return CopyDevice(rt, dst, src); });
}

// ---- cross-entropy

absl::StatusOr<std::unique_ptr<CrossEntropyTrial>> CrossEntropyTrial::Create(
    const Runtime& rt, const CrossEntropySpec& spec, int64_t rows) {
  CrossEntropySpec heuristic_spec = spec;
  heuristic_spec.config.reset();
  KJIT_ASSIGN_OR_RETURN(CrossEntropy heuristic, rt.CrossEntropy(heuristic_spec));
  const int64_t row_bytes = spec.vocab * static_cast<int64_t>(SizeOf(spec.dtype));
  const size_t index_bytes = SizeOf(spec.target_type);
  const int64_t losses = spec.reduction == Reduction::kNone ? rows : 1;
  const int64_t workspace_bytes = heuristic.WorkspaceBytes(rows);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer pristine, DeviceBuffer::Create(rt, rows * row_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer work, DeviceBuffer::Create(rt, rows * row_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer targets, DeviceBuffer::Create(rt, rows * index_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer loss, DeviceBuffer::Create(rt, losses * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(rt, rows * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::Create(rt, workspace_bytes));
  std::unique_ptr<CrossEntropyTrial> t(
      new CrossEntropyTrial(rt, std::move(pristine), std::move(work), std::move(targets),
                            std::move(loss), std::move(lse), std::move(workspace)));
  t->spec_ = heuristic_spec;
  t->rows_ = rows;
  t->workspace_bytes_ = workspace_bytes;
  // Logits spread over [-8, 8): a softmax neither flat nor one-hot.
  KJIT_RETURN_IF_ERROR(RandomFill(rt, t->pristine_.data(), spec.dtype, rows, spec.vocab,
                                  spec.vocab, 0x5eed, -8.0f, 8.0f));
  KJIT_RETURN_IF_ERROR(
      RandomTargets(rt, t->targets_.data(), spec.target_type, rows, 0x5eed, spec.vocab));

  t->sample_ = SampleRows(rows);
  std::vector<double> logits;
  std::vector<int64_t> sample_targets;
  for (int64_t r : t->sample_) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> row,
                          DownloadValues(t->pristine_, spec.dtype, r * row_bytes, row_bytes));
    logits.insert(logits.end(), row.begin(), row.end());
    // Little-endian: an int32 target lands in the low half of the zeroed int64.
    int64_t target = 0;
    KJIT_RETURN_IF_ERROR(t->targets_.Download(&target, index_bytes, r * index_bytes));
    sample_targets.push_back(target);
  }
  // The sampled rows are checked as a problem of their own with reduction none and each row's
  // share of the real reduction as its upstream scale (1 / rows for the mean: every target valid).
  t->math_ = {.vocab = spec.vocab, .dtype = spec.dtype, .ignore_index = spec.ignore_index,
              .reduction = Reduction::kNone, .label_smoothing = spec.label_smoothing,
              .lse_square_scale = spec.lse_square_scale, .softcap = spec.softcap};
  const std::vector<double> scale(t->sample_.size(),
                                  spec.reduction == Reduction::kMean ? 1.0 / rows : 1.0);
  t->ref_ = CrossEntropyReference(t->math_, t->checked_rows(), logits, sample_targets, &scale,
                                  /*with_grad=*/true);
  return t;
}

absl::Status CrossEntropyTrial::Restore() const { return CopyDevice(rt_, work_, pristine_); }

CrossEntropyArgs CrossEntropyTrial::Args(bool gradient) const {
  const DeviceBuffer& logits_buf = gradient ? work_ : pristine_;
  const TensorView logits = TensorView::Matrix(logits_buf.data(), spec_.dtype, rows_, spec_.vocab);
  return {.logits = logits,
          .targets = IndexView::Of(targets_.data(), spec_.target_type, rows_),
          .loss = TensorView::Vector(loss_.data(), DType::kF32,
                                     spec_.reduction == Reduction::kNone ? rows_ : 1),
          .lse = TensorView::Vector(lse_.data(), DType::kF32, rows_),
          .grad = gradient ? logits : TensorView{},  // in place
          .workspace = workspace_.data(),
          .workspace_bytes = workspace_bytes_};
}

absl::Status CrossEntropyTrial::Check(const CrossEntropy& op) {
  KJIT_RETURN_IF_ERROR(Restore());
  KJIT_RETURN_IF_ERROR(lse_.Fill(0xFF));  // NaN: an unwritten lse fails
  KJIT_RETURN_IF_ERROR(op.ForwardBackward(nullptr, Args(/*gradient=*/true)));
  const int64_t row_bytes = spec_.vocab * static_cast<int64_t>(SizeOf(spec_.dtype));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> all_lse, DownloadValues(lse_, DType::kF32));
  std::vector<double> grad, lse;
  for (int64_t r : sample_) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> g,
                          DownloadValues(work_, spec_.dtype, r * row_bytes, row_bytes));
    grad.insert(grad.end(), g.begin(), g.end());
    lse.push_back(all_lse[r]);
  }
  return Mismatches(
      fmt::format("cross_entropy vocab={} rows={} {}", spec_.vocab, rows_, op.config().ToString()),
      CheckCrossEntropy(math_, {.lse = &lse, .grad = &grad}, ref_));
}

absl::StatusOr<Timing> CrossEntropyTrial::Time(const CrossEntropy& op, Pass pass, GpuTimer& timer,
                                               int repeats) {
  switch (pass) {
    case Pass::kForwardBackward: {
      const CrossEntropyArgs args = Args(true);
      return timer.Time(repeats, [&] { return op.ForwardBackward(nullptr, args); },
                        [&] { return Restore(); });
    }
    case Pass::kForward: {
      const CrossEntropyArgs args = Args(false);
      return timer.Time(repeats, [&] { return op.Forward(nullptr, args); });
    }
    case Pass::kBackward: break;
  }
  return absl::InvalidArgumentError("pass: cross_entropy trials time forward or forward_backward");
}

double CrossEntropyTrial::Bytes(Pass pass) const {
  const double logits = static_cast<double>(rows_) * spec_.vocab * SizeOf(spec_.dtype);
  return pass == Pass::kForward ? logits : 2 * logits;
}

// ---- RMSNorm

struct RmsNormTrial::Buffers {
  DeviceBuffer x, w, dy, residual, y, residual_out, rstd, dx, dw;
  std::optional<DeviceBuffer> workspace;
};

namespace {

// The values of whole rows `sample` of a [rows, hidden] buffer, downloaded and decoded.
absl::StatusOr<std::vector<double>> SampledRows(const DeviceBuffer& b, DType dtype, int64_t hidden,
                                                const std::vector<int64_t>& sample) {
  const size_t row_bytes = hidden * SizeOf(dtype);
  std::vector<double> out;
  for (int64_t r : sample) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> row, DownloadValues(b, dtype, r * row_bytes, row_bytes));
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// The reference's per-row results for the sampled rows only; dw (a sum over all rows) stays whole.
template <typename T>
std::vector<T> Rows(const std::vector<T>& v, int64_t width, const std::vector<int64_t>& sample) {
  std::vector<T> out;
  if (v.empty()) return out;
  for (int64_t r : sample) out.insert(out.end(), v.begin() + r * width, v.begin() + (r + 1) * width);
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
    KJIT_RETURN_IF_ERROR(RandomFill(rt, residual.data(), dtype, rows, hidden, hidden, 4, -2.0f, 2.0f));
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

  t->math_ = {.hidden = hidden, .dtype = dtype, .eps = spec.eps,
              .weight_offset = spec.weight_offset,
              .gemma_cast = spec.casting == RmsNormCasting::kGemma};
  RmsNormForwardResult f =
      RmsNormForwardReference(t->math_, rows, hx, spec.fused_residual ? &hres : nullptr, hw);
  // The backward normalizes what the forward did: residual_out when fused.
  RmsNormBackwardResult b =
      RmsNormBackwardReference(t->math_, rows, hdy, spec.fused_residual ? f.residual_out : hx, hw, nullptr);
  t->sample_ = SampleRows(rows);
  t->ref_f_ = {Rows(f.y, hidden, t->sample_), Rows(f.rstd, 1, t->sample_),
               Rows(f.residual_out, hidden, t->sample_)};
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
      .dw = TensorView::Vector(b_->dw.data(), spec_.weight_dtype.value_or(spec_.dtype),
                               spec_.hidden),
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
  KJIT_RETURN_IF_ERROR(op.Backward(nullptr, b));
  const DType dtype = spec_.dtype, wdtype = spec_.weight_dtype.value_or(dtype);
  const int64_t hidden = spec_.hidden;
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> y, SampledRows(b_->y, dtype, hidden, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> rstd,
                        SampledRows(b_->rstd, DType::kF32, 1, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> dx, SampledRows(b_->dx, dtype, hidden, sample_));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> dw, DownloadValues(b_->dw, wdtype));
  std::vector<double> residual_out;
  if (spec_.fused_residual) {
    KJIT_ASSIGN_OR_RETURN(residual_out, SampledRows(b_->residual_out, dtype, hidden, sample_));
  }
  return Mismatches(
      fmt::format("rms_norm hidden={} rows={} {}", hidden, rows_, op.config().ToString()),
      CheckRmsNorm(math_, static_cast<int64_t>(sample_.size()), wdtype,
                   {.y = &y, .rstd = &rstd,
                    .residual_out = spec_.fused_residual ? &residual_out : nullptr,
                    .dx = &dx, .dw = &dw},
                   ref_f_, &ref_b_));
}

absl::StatusOr<Timing> RmsNormTrial::Time(const RmsNorm& op, Pass pass, GpuTimer& timer,
                                          int repeats) {
  KJIT_ASSIGN_OR_RETURN(const RmsNormForwardArgs f, ForwardArgs());
  KJIT_ASSIGN_OR_RETURN(const RmsNormBackwardArgs b, BackwardArgs(op));
  return timer.Time(repeats, [&]() -> absl::Status {
    if (pass != Pass::kBackward) KJIT_RETURN_IF_ERROR(op.Forward(nullptr, f));
    if (pass != Pass::kForward) KJIT_RETURN_IF_ERROR(op.Backward(nullptr, b));
    return absl::OkStatus();
  });
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

}  // namespace kjit::autotune
