#include "ops/log_probs/tuning/trial.h"

#include <cstring>

#include <fmt/format.h>

#include "kjit/host_convert.h"

namespace kjit::ops {

namespace {
enum Buffer { kPristine, kWork, kTargets, kLogprob, kEntropy, kLse, kGradLogprob, kGradEntropy };

std::vector<double> At(const std::vector<double>& all, const std::vector<int64_t>& rows) {
  std::vector<double> out;
  for (int64_t r : rows) out.push_back(all[r]);
  return out;
}
}  // namespace

absl::StatusOr<std::unique_ptr<LogProbsTrial>> LogProbsTrial::Create(const Runtime& rt,
                                                                     const LogProbsSpec& spec,
                                                                     int64_t rows) {
  std::unique_ptr<LogProbsTrial> t(new LogProbsTrial());
  t->spec_ = spec;
  t->spec_.config.reset();
  t->rows_ = rows;
  const int64_t logits_bytes = rows * spec.vocab * static_cast<int64_t>(SizeOf(spec.dtype));
  const int64_t index_bytes = rows * static_cast<int64_t>(SizeOf(spec.target_type));
  for (int64_t bytes : {logits_bytes, logits_bytes, index_bytes, rows * 4, rows * 4, rows * 4,
                        rows * 4, rows * 4}) {
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes));
    t->buffers_.push_back(std::move(b));
  }
  auto& b = t->buffers_;
  // Logits spread over [-8, 8): a softmax neither flat nor one-hot.
  KJIT_RETURN_IF_ERROR(RandomFill(rt, b[kPristine].data(), spec.dtype, rows, spec.vocab, spec.vocab,
                                  0x5eed, -8.0f, 8.0f));
  KJIT_RETURN_IF_ERROR(
      RandomTargets(rt, b[kTargets].data(), spec.target_type, rows, 0x5eed, spec.vocab));
  KJIT_RETURN_IF_ERROR(
      RandomFill(rt, b[kGradLogprob].data(), DType::kF32, 1, rows, rows, 0x9a1, -1.0f, 1.0f));
  KJIT_RETURN_IF_ERROR(
      RandomFill(rt, b[kGradEntropy].data(), DType::kF32, 1, rows, rows, 0x9a2, -1.0f, 1.0f));

  t->sample_ = SampleRows(rows);
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> logits,
                        SampledRows(b[kPristine], spec.dtype, spec.vocab, t->sample_));
  std::vector<unsigned char> target_bytes(index_bytes);
  KJIT_RETURN_IF_ERROR(b[kTargets].Download(target_bytes.data(), target_bytes.size()));
  std::vector<int64_t> targets;
  for (int64_t r : t->sample_) {
    int64_t target = 0;  // little-endian: an int32 lands in the low half
    std::memcpy(&target, &target_bytes[r * SizeOf(spec.target_type)], SizeOf(spec.target_type));
    targets.push_back(target);
  }
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> g_lp,
                        DownloadValues(b[kGradLogprob], DType::kF32));
  KJIT_ASSIGN_OR_RETURN(const std::vector<double> g_h,
                        DownloadValues(b[kGradEntropy], DType::kF32));
  const std::vector<double> sampled_lp = At(g_lp, t->sample_), sampled_h = At(g_h, t->sample_);
  t->ref_ = LogProbsReference(spec, t->checked_rows(), logits, targets, &sampled_lp,
                              spec.entropy ? &sampled_h : nullptr);
  return t;
}

LogProbsArgs LogProbsTrial::ForwardArgs(const DeviceBuffer& logits) const {
  auto vec = [&](Buffer which) {
    return TensorView::Vector(buffers_[which].data(), DType::kF32, rows_);
  };
  return {.logits = TensorView::Matrix(logits.data(), spec_.dtype, rows_, spec_.vocab),
          .targets = IndexView::Of(buffers_[kTargets].data(), spec_.target_type, rows_),
          .logprob = vec(kLogprob),
          .entropy = spec_.entropy ? vec(kEntropy) : TensorView{},
          .lse = vec(kLse)};
}

LogProbsBackwardArgs LogProbsTrial::BackwardArgs() const {
  const LogProbsArgs f = ForwardArgs(buffers_[kWork]);
  auto vec = [&](Buffer which) {
    return TensorView::Vector(buffers_[which].data(), DType::kF32, rows_);
  };
  return {.logits = f.logits,
          .targets = f.targets,
          .lse = f.lse,
          .entropy = f.entropy,
          .grad_logprob = vec(kGradLogprob),
          .grad_entropy = spec_.entropy ? vec(kGradEntropy) : TensorView{},
          .grad = f.logits};  // in place
}

absl::Status LogProbsTrial::Forward(const LogProbs& op, const DeviceBuffer& logits) const {
  return op.Forward(nullptr, ForwardArgs(logits));
}

absl::Status LogProbsTrial::Check(const LogProbs& op, Pass pass) {
  for (Buffer which : {kLogprob, kEntropy, kLse}) {
    KJIT_RETURN_IF_ERROR(buffers_[which].Fill(0xFF));  // NaN: an unwritten output fails
  }
  KJIT_RETURN_IF_ERROR(buffers_[kWork].CopyFrom(buffers_[kPristine]));
  KJIT_RETURN_IF_ERROR(Forward(op, buffers_[kWork]));
  std::vector<std::pair<std::string, CompareResult>> results;
  // fp32 statistics over the row: a few ulps of the row's largest terms.
  const Tolerance stats{.rtol = 1e-5, .atol = 1e-5};
  std::vector<std::pair<const char*, std::pair<Buffer, const std::vector<double>*>>> outputs = {
      {"logprob", {kLogprob, &ref_.logprob}}, {"lse", {kLse, &ref_.lse}}};
  if (spec_.entropy) outputs.push_back({"entropy", {kEntropy, &ref_.entropy}});
  for (const auto& [name, which] : outputs) {
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> all,
                          DownloadValues(buffers_[which.first], DType::kF32));
    results.emplace_back(name, Compare(At(all, sample_), *which.second, stats));
  }
  if (pass != Pass::kForward) {
    KJIT_RETURN_IF_ERROR(op.Backward(nullptr, BackwardArgs()));
    KJIT_ASSIGN_OR_RETURN(const std::vector<double> grad,
                          SampledRows(buffers_[kWork], spec_.dtype, spec_.vocab, sample_));
    results.emplace_back("grad",
                         Compare(grad, ref_.grad,
                                 {.rtol = 4 * RoundingRtol(spec_.dtype),
                                  .atol = 1e-5 * MaxAbs(ref_.grad) + RoundingAtol(spec_.dtype)}));
  }
  return Mismatches(fmt::format("log_probs {} vocab={} rows={} {}", Name(pass), spec_.vocab, rows_,
                                op.config().ToString()),
                    results);
}

absl::StatusOr<TimedWork> LogProbsTrial::Work(const LogProbs& op, Pass pass) {
  auto restore = [this] { return buffers_[kWork].CopyFrom(buffers_[kPristine]); };
  switch (pass) {
    case Pass::kForward:
      return TimedWork{[this, &op] { return Forward(op, buffers_[kPristine]); }, nullptr};
    case Pass::kBackward:
      return TimedWork{[&op, args = BackwardArgs()] { return op.Backward(nullptr, args); },
                       restore};
    case Pass::kForwardBackward:
      return TimedWork{[this, &op, args = BackwardArgs()] {
                         KJIT_RETURN_IF_ERROR(Forward(op, buffers_[kWork]));
                         return op.Backward(nullptr, args);
                       },
                       restore};
  }
  return absl::InvalidArgumentError("pass: unknown");
}

double LogProbsTrial::Bytes(Pass pass) const {
  const double logits = static_cast<double>(rows_) * spec_.vocab * SizeOf(spec_.dtype);
  return pass == Pass::kForward ? logits : pass == Pass::kBackward ? 2 * logits : 3 * logits;
}

}  // namespace kjit::ops
