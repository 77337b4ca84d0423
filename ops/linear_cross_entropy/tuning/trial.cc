#include "ops/linear_cross_entropy/tuning/trial.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>
#include <utility>

#include <fmt/format.h>

#include "ops/common/tuning/compare.h"
#include "ops/linear_cross_entropy/config.h"
#include "ops/linear_cross_entropy/tuning/search_space.h"
#include "ops/linear_cross_entropy/tuning/unfused.h"

namespace kjit::ops {

namespace {

enum Buffer { kHidden, kWeight, kTargets, kLoss, kDHidden, kDWeight, kWorkspace };

}  // namespace

absl::StatusOr<std::unique_ptr<LinearCrossEntropyTrial>> LinearCrossEntropyTrial::Create(
    const Runtime& rt, const LinearCrossEntropySpec& spec, int64_t rows) {
  std::unique_ptr<LinearCrossEntropyTrial> t(new LinearCrossEntropyTrial());
  t->spec_ = spec;
  t->spec_.config.reset();
  t->rows_ = rows;
  const int64_t V = spec.vocab, H = spec.hidden;
  const int64_t e = static_cast<int64_t>(SizeOf(spec.dtype));
  const int64_t wg = static_cast<int64_t>(SizeOf(spec.weight_grad()));
  KJIT_ASSIGN_OR_RETURN(LinearCrossEntropy heuristic, rt.LinearCrossEntropy(t->spec_));
  // The largest workspace a config of the search space asks for at these rows. Not always the
  // heuristic's: when its chunk takes every row it writes d_weight directly, and a smaller chunk
  // then needs the fp32 accumulator (2 GiB at LLaMA 3's lm_head).
  t->workspace_bytes_ = heuristic.WorkspaceBytes(rows);
  std::set<std::tuple<int64_t, int64_t, int>> sized;  // the chunking and streams decide the size
  for (const auto& candidate :
       LinearCrossEntropySearchSpace(t->spec_, DefaultLinearCrossEntropyConfig(t->spec_))) {
    if (!candidate.pruned.empty() ||
        !sized
             .insert({candidate.config.chunk_rows, candidate.config.whole_rows,
                      candidate.config.streams})
             .second) {
      continue;
    }
    LinearCrossEntropySpec with_config = t->spec_;
    with_config.config = candidate.config;
    KJIT_ASSIGN_OR_RETURN(LinearCrossEntropy op, rt.LinearCrossEntropy(with_config));
    t->workspace_bytes_ = std::max(t->workspace_bytes_, op.WorkspaceBytes(rows));
  }
  for (int64_t bytes :
       {rows * H * e, V * H * e, rows * static_cast<int64_t>(SizeOf(spec.loss.target_type)),
        int64_t{4} * (spec.loss.reduction == Reduction::kNone ? rows : 1), rows * H * e, V * H * wg,
        t->workspace_bytes_}) {
    KJIT_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Create(rt, bytes));
    t->buffers_.push_back(std::move(b));
  }
  const float w_range = 1.5f / std::sqrt(static_cast<float>(H));
  KJIT_RETURN_IF_ERROR(
      RandomFill(rt, t->buffers_[kHidden].data(), spec.dtype, rows, H, H, 0x5eed, -2, 2));
  KJIT_RETURN_IF_ERROR(
      RandomFill(rt, t->buffers_[kWeight].data(), spec.dtype, V, H, H, 0x5eee, -w_range, w_range));
  KJIT_RETURN_IF_ERROR(
      RandomTargets(rt, t->buffers_[kTargets].data(), spec.loss.target_type, rows, 0x5eed, V));
  t->sampled_rows_ = SampleRows(rows);
  t->sampled_vocab_rows_ = SampleRows(V);

  // The unfused path, once, with an fp32 d_weight.
  CrossEntropySpec loss_spec = spec.ChunkLoss();
  loss_spec.loss.reduction =
      spec.loss.reduction == Reduction::kNone ? Reduction::kSum : spec.loss.reduction;
  KJIT_ASSIGN_OR_RETURN(DeviceBuffer d_weight, DeviceBuffer::Create(rt, V * H * 4));
  {
    KJIT_ASSIGN_OR_RETURN(
        std::unique_ptr<UnfusedLinearCrossEntropy> unfused,
        UnfusedLinearCrossEntropy::Create(
            rt, loss_spec,
            {.hidden = TensorView::Matrix(t->buffers_[kHidden].data(), spec.dtype, rows, H),
             .weight = TensorView::Matrix(t->buffers_[kWeight].data(), spec.dtype, V, H),
             .targets = IndexView::Of(t->buffers_[kTargets].data(), spec.loss.target_type, rows),
             .loss = TensorView::Vector(t->buffers_[kLoss].data(), DType::kF32, 1),
             .d_hidden = TensorView::Matrix(t->buffers_[kDHidden].data(), spec.dtype, rows, H),
             .d_weight = TensorView::Matrix(d_weight.data(), DType::kF32, V, H)}));
    KJIT_RETURN_IF_ERROR(unfused->Run(nullptr));
  }  // the logits freed
  KJIT_ASSIGN_OR_RETURN(std::vector<double> loss,
                        DownloadValues(t->buffers_[kLoss], DType::kF32, 0, 4));
  t->loss_ = loss[0];
  KJIT_ASSIGN_OR_RETURN(t->d_hidden_rows_,
                        SampledRows(t->buffers_[kDHidden], spec.dtype, H, t->sampled_rows_));
  KJIT_ASSIGN_OR_RETURN(t->d_weight_rows_,
                        SampledRows(d_weight, DType::kF32, H, t->sampled_vocab_rows_));
  return t;
}

LinearCrossEntropyArgs LinearCrossEntropyTrial::Args(const LinearCrossEntropy& op) const {
  const LinearCrossEntropySpec& s = op.spec();
  const int64_t R = rows_;
  return {
      .hidden_states = TensorView::Matrix(buffers_[kHidden].data(), s.dtype, R, s.hidden),
      .weight = TensorView::Matrix(buffers_[kWeight].data(), s.dtype, s.vocab, s.hidden),
      .targets = IndexView::Of(buffers_[kTargets].data(), s.loss.target_type, R),
      .loss = TensorView::Vector(buffers_[kLoss].data(), DType::kF32,
                                 s.loss.reduction == Reduction::kNone ? R : 1),
      .d_hidden = TensorView::Matrix(buffers_[kDHidden].data(), s.dtype, R, s.hidden),
      .d_weight = TensorView::Matrix(buffers_[kDWeight].data(), s.weight_grad(), s.vocab, s.hidden),
      .workspace = buffers_[kWorkspace].data(),
      .workspace_bytes = op.WorkspaceBytes(R)};
}

absl::Status LinearCrossEntropyTrial::Check(const LinearCrossEntropy& op, Pass pass) {
  if (pass != Pass::kForwardBackward) {
    return absl::InvalidArgumentError(
        fmt::format("pass: linear_cross_entropy checks forward_backward, not {}", Name(pass)));
  }
  if (op.WorkspaceBytes(rows_) > workspace_bytes_) {
    return absl::InvalidArgumentError(
        fmt::format("config {} needs a {}-byte workspace, more than the {} the trial holds",
                    op.ConfigFor(rows_).ToString(), op.WorkspaceBytes(rows_), workspace_bytes_));
  }
  for (Buffer b : {kLoss, kDHidden, kDWeight}) KJIT_RETURN_IF_ERROR(buffers_[b].Fill(0xFF));
  KJIT_RETURN_IF_ERROR(op.ForwardBackward(nullptr, Args(op)));
  std::vector<std::pair<std::string, CompareResult>> results;
  if (spec_.loss.reduction != Reduction::kNone) {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> loss,
                          DownloadValues(buffers_[kLoss], DType::kF32, 0, 4));
    results.emplace_back("loss", Compare(loss, {loss_}, {.rtol = 1e-3}));
  }
  KJIT_ASSIGN_OR_RETURN(std::vector<double> dh,
                        SampledRows(buffers_[kDHidden], spec_.dtype, spec_.hidden, sampled_rows_));
  results.emplace_back("d_hidden", CompareGemmResult(dh, d_hidden_rows_, spec_.dtype));
  KJIT_ASSIGN_OR_RETURN(std::vector<double> dw, SampledRows(buffers_[kDWeight], spec_.weight_grad(),
                                                            spec_.hidden, sampled_vocab_rows_));
  results.emplace_back("d_weight", CompareGemmResult(dw, d_weight_rows_, spec_.weight_grad()));
  return Mismatches(fmt::format("linear_cross_entropy {}", op.ConfigFor(rows_).ToString()),
                    results);
}

absl::StatusOr<TimedWork> LinearCrossEntropyTrial::Work(const LinearCrossEntropy& op, Pass pass) {
  if (pass != Pass::kForwardBackward) {
    return absl::InvalidArgumentError(
        fmt::format("pass: linear_cross_entropy times forward_backward, not {}", Name(pass)));
  }
  const LinearCrossEntropyArgs args = Args(op);
  return TimedWork{.launch = [&op, args] { return op.ForwardBackward(nullptr, args); }};
}

double LinearCrossEntropyTrial::Bytes(Pass) const {
  const double e = static_cast<double>(SizeOf(spec_.dtype));
  return e * (2.0 * rows_ * spec_.hidden + 2.0 * spec_.vocab * spec_.hidden);
}

}  // namespace kjit::ops
