#include "ops/cross_entropy/tuning/trial.h"

#include <cstring>

#include <fmt/format.h>

#include "kjit/host_convert.h"
#include "ops/common/parallel.h"

namespace kjit::ops {

absl::StatusOr<std::unique_ptr<CrossEntropyTrial>> CrossEntropyTrial::Create(
    const Runtime& rt, const CrossEntropySpec& spec, int64_t rows) {
  CrossEntropySpec heuristic_spec = spec;
  heuristic_spec.config.reset();
  KJIT_ASSIGN_OR_RETURN(CrossEntropy heuristic, rt.CrossEntropy(heuristic_spec));
  const int64_t row_bytes = spec.vocab * static_cast<int64_t>(SizeOf(spec.dtype));
  const size_t index_bytes = SizeOf(spec.loss.target_type);
  const int64_t losses = spec.loss.reduction == Reduction::kNone ? rows : 1;
  const int64_t workspace_bytes = heuristic.WorkspaceBytes(rows);
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer pristine, DeviceBuffer::Create(rt, rows * row_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer work, DeviceBuffer::Create(rt, rows * row_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer targets, DeviceBuffer::Create(rt, rows * index_bytes));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer loss, DeviceBuffer::Create(rt, losses * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer lse, DeviceBuffer::Create(rt, rows * sizeof(float)));
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer workspace, DeviceBuffer::Create(rt, workspace_bytes));
  std::unique_ptr<CrossEntropyTrial> t(new CrossEntropyTrial(std::move(pristine), std::move(work),
                                                             std::move(targets), std::move(loss),
                                                             std::move(lse), std::move(workspace)));
  t->spec_ = heuristic_spec;
  t->rows_ = rows;
  t->workspace_bytes_ = workspace_bytes;
  // Logits spread over [-8, 8): a softmax neither flat nor one-hot.
  KJIT_RETURN_IF_ERROR(RandomFill(rt, t->pristine_.data(), spec.dtype, rows, spec.vocab, spec.vocab,
                                  0x5eed, -8.0f, 8.0f));
  KJIT_RETURN_IF_ERROR(
      RandomTargets(rt, t->targets_.data(), spec.loss.target_type, rows, 0x5eed, spec.vocab));

  // The targets once, whole: the class weights' mean divisor reads every row's, the reference the
  // sampled rows'.
  std::vector<unsigned char> target_bytes(rows * index_bytes);
  KJIT_RETURN_IF_ERROR(t->targets_.Download(target_bytes.data(), target_bytes.size()));
  auto target_of = [&](int64_t r) {
    int64_t target = 0;  // little-endian: an int32 lands in the low half
    std::memcpy(&target, &target_bytes[r * index_bytes], index_bytes);
    return target;
  };

  std::vector<double> class_weight;
  double mean_divisor = static_cast<double>(rows);
  if (spec.loss.class_weight_dtype) {
    const DType wt = *spec.loss.class_weight_dtype;
    KJIT_ASSIGN_OR_RETURN(t->class_weight_,
                          DeviceBuffer::Create(rt, spec.vocab * static_cast<int64_t>(SizeOf(wt))));
    KJIT_RETURN_IF_ERROR(RandomFill(rt, t->class_weight_->data(), wt, 1, spec.vocab, spec.vocab,
                                    0x3e16, 0.5f, 1.5f));
    KJIT_ASSIGN_OR_RETURN(class_weight, DownloadValues(*t->class_weight_, wt));
    // The mean divides by every row's target weight (all targets are valid).
    mean_divisor = 0;
    for (int64_t r = 0; r < rows; ++r) mean_divisor += class_weight[target_of(r)];
  }

  t->sample_ = SampleRows(rows);
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> logits,
                        SampledRows(t->pristine_, spec.dtype, spec.vocab, t->sample_));
  std::vector<int64_t> sample_targets;
  for (int64_t r : t->sample_) sample_targets.push_back(target_of(r));
  // The sampled rows are checked as a problem of their own with reduction none and each row's
  // share of the real reduction as its upstream scale (for the mean 1 / rows, every target being
  // valid, or 1 / their weights summed).
  t->math_ = {.vocab = spec.vocab,
              .dtype = spec.dtype,
              .loss = spec.loss,
              .class_weight = std::move(class_weight)};
  t->math_.loss.reduction = Reduction::kNone;
  const std::vector<double> scale(
      t->sample_.size(), spec.loss.reduction == Reduction::kMean ? 1.0 / mean_divisor : 1.0);
  t->ref_ = CrossEntropyReference(t->math_, t->checked_rows(), logits, sample_targets, &scale,
                                  /*with_grad=*/true);
  return t;
}

absl::Status CrossEntropyTrial::Restore() const { return work_.CopyFrom(pristine_); }

CrossEntropyArgs CrossEntropyTrial::Args(bool gradient) const {
  const DeviceBuffer& logits_buf = gradient ? work_ : pristine_;
  const TensorView logits = TensorView::Matrix(logits_buf.data(), spec_.dtype, rows_, spec_.vocab);
  return {.logits = logits,
          .targets = IndexView::Of(targets_.data(), spec_.loss.target_type, rows_),
          .loss = TensorView::Vector(loss_.data(), DType::kF32,
                                     spec_.loss.reduction == Reduction::kNone ? rows_ : 1),
          .lse = TensorView::Vector(lse_.data(), DType::kF32, rows_),
          .grad = gradient ? logits : TensorView{},  // in place
          .class_weight = class_weight_
                              ? TensorView::Vector(class_weight_->data(),
                                                   *spec_.loss.class_weight_dtype, spec_.vocab)
                              : TensorView{},
          .workspace = workspace_.data(),
          .workspace_bytes = workspace_bytes_};
}

absl::Status CrossEntropyTrial::Check(const CrossEntropy& op, Pass pass) {
  const bool gradient = pass != Pass::kForward;
  if (gradient) KJIT_RETURN_IF_ERROR(Restore());
  KJIT_RETURN_IF_ERROR(lse_.Fill(0xFF));  // NaN: an unwritten lse fails
  KJIT_RETURN_IF_ERROR(gradient ? op.ForwardBackward(nullptr, Args(true))
                                : op.Forward(nullptr, Args(false)));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> all_lse, DownloadValues(lse_, DType::kF32));
  std::vector<double> lse;
  for (int64_t r : sample_) lse.push_back(all_lse[r]);
  auto results = CheckCrossEntropy(math_, {.lse = &lse}, ref_);
  if (gradient) {
    // Decoded and compared a row per core at a time: the sampled rows of a 128K vocab are 8M
    // elements, 0.2 s on one core, which made the check most of a candidate's time in the tuner.
    const int64_t rows = static_cast<int64_t>(sample_.size());
    const int64_t row_bytes = spec_.vocab * static_cast<int64_t>(SizeOf(spec_.dtype));
    std::vector<unsigned char> raw(rows * row_bytes);
    for (int64_t i = 0; i < rows; ++i) {
      KJIT_RETURN_IF_ERROR(
          work_.Download(raw.data() + i * row_bytes, row_bytes, sample_[i] * row_bytes));
    }
    std::vector<CompareResult> by_row(rows);
    ForEachIndex(rows, spec_.vocab, [&](int64_t i) {
      const std::vector<unsigned char> bytes(raw.begin() + i * row_bytes,
                                             raw.begin() + (i + 1) * row_bytes);
      by_row[i] = CheckCrossEntropyGradRows(math_, ref_, i, Decode(bytes, spec_.dtype));
    });
    CompareResult grad;
    for (int64_t i = 0; i < rows; ++i) grad.Merge(by_row[i], i * spec_.vocab);
    results.emplace_back("grad", grad);
  }
  return Mismatches(fmt::format("cross_entropy {} vocab={} rows={} {}", Name(pass), spec_.vocab,
                                rows_, op.config().ToString()),
                    results);
}

absl::StatusOr<TimedWork> CrossEntropyTrial::Work(const CrossEntropy& op, Pass pass) {
  switch (pass) {
    case Pass::kForwardBackward:
      return TimedWork{[&op, args = Args(true)] { return op.ForwardBackward(nullptr, args); },
                       [this] { return Restore(); }};
    case Pass::kForward:
      return TimedWork{[&op, args = Args(false)] { return op.Forward(nullptr, args); }, nullptr};
    case Pass::kBackward: break;
  }
  return absl::InvalidArgumentError("pass: cross_entropy trials time forward or forward_backward");
}

double CrossEntropyTrial::Bytes(Pass pass) const {
  const double logits = static_cast<double>(rows_) * spec_.vocab * SizeOf(spec_.dtype);
  return pass == Pass::kForward ? logits : 2 * logits;
}

}  // namespace kjit::ops
