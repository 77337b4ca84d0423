// The kjit path: kjit's RMSNorm (rstd saved for the backward), the lm_head through cuBLASLt into
// bf16 logits, kjit's fused cross-entropy writing the gradient over the logits in place, the
// lm_head's two backward matmuls reading that gradient, and kjit's RMSNorm backward in place over
// dy.
//
// The rows go through the lm_head and the loss `chunk_rows` at a time. Each chunk's loss is summed
// (reduction sum) and its gradient scaled by 1 / (valid targets of the whole batch), passed as the
// upstream gradient, so the chunks add up to the mean; the weight gradient accumulates over the
// chunks in bf16 (cuBLASLt's beta = 1), as Liger-Kernel's does.
#include <algorithm>
#include <optional>

#include "bench/finetune_step/step.h"

namespace finetune {

namespace {

using kjit::DType;
using kjit::TensorView;

class KjitPath : public Path {
 public:
  KjitPath(const kjit::Runtime& rt, const Problem& problem, const SharedInputs& in,
           int64_t chunk_rows, std::string name)
      : Path(rt, problem, in, std::move(name)),
        chunk_rows_(std::min(chunk_rows, problem.tokens())),
        chunks_((problem.tokens() + chunk_rows_ - 1) / chunk_rows_) {}

  absl::Status Init() {
    KJIT_RETURN_IF_ERROR(AllocateCommon());
    KJIT_ASSIGN_OR_RETURN(
        norm_,
        rt_.RmsNorm({.hidden = problem_.hidden, .dtype = DType::kBF16, .eps = problem_.eps}));
    KJIT_ASSIGN_OR_RETURN(ce_, rt_.CrossEntropy({.vocab = problem_.vocab,
                                                 .dtype = DType::kBF16,
                                                 .target_type = kjit::IndexType::kInt64,
                                                 .ignore_index = kIgnoreIndex,
                                                 .reduction = kjit::Reduction::kSum}));
    KJIT_ASSIGN_OR_RETURN(loss_parts_, pool_.NewTensor("loss per chunk", DType::kF32, 1, chunks_));
    KJIT_ASSIGN_OR_RETURN(
        ce_workspace_, pool_.Allocate("cross-entropy workspace", ce_->WorkspaceBytes(chunk_rows_)));
    KJIT_ASSIGN_OR_RETURN(norm_workspace_,
                          pool_.Allocate("RMSNorm backward workspace",
                                         norm_->BackwardWorkspaceBytes(problem_.tokens())));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Loss() const override {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> parts, Download(rt_, loss_parts_.view));
    double sum = 0;
    for (double p : parts) sum += p;
    return sum / static_cast<double>(in_.valid_targets);
  }

  absl::Status Step() override;

 private:
  const int64_t chunk_rows_, chunks_;
  std::optional<kjit::RmsNorm> norm_;
  std::optional<kjit::CrossEntropy> ce_;
  Tensor loss_parts_;
  Buffer ce_workspace_, norm_workspace_;
};

absl::Status KjitPath::Step() {
  const int64_t n = problem_.tokens(), h = problem_.hidden, v = problem_.vocab;
  LtMatmul& mm = *matmul_;
  const TensorView hidden = in_.hidden.view, weight = in_.norm_weight.view;

  KJIT_ASSIGN_OR_RETURN(Tensor y, pool_.NewTensor("y", DType::kBF16, n, h));
  KJIT_ASSIGN_OR_RETURN(Tensor rstd, pool_.NewTensor("rstd", DType::kF32, 1, n));
  KJIT_RETURN_IF_ERROR(
      norm_->Forward(nullptr, {.x = hidden, .weight = weight, .y = y.view, .rstd = rstd.view}));

  KJIT_ASSIGN_OR_RETURN(Tensor logits, pool_.NewTensor("logits", DType::kBF16, chunk_rows_, v));
  const TensorView dy = dx_.view;  // the lm_head's input gradient goes where dx will be
  for (int64_t c = 0; c < chunks_; ++c) {
    const int64_t first = c * chunk_rows_, rows = std::min(chunk_rows_, n - first);
    const TensorView y_rows = Rows(y.view, first, rows), chunk = Rows(logits.view, 0, rows);
    KJIT_RETURN_IF_ERROR(mm.Run(y_rows, false, in_.lm_head.view, true, chunk));
    KJIT_RETURN_IF_ERROR(ce_->ForwardBackward(
        nullptr,
        {.logits = chunk,
         .targets = kjit::IndexView::Of(static_cast<int64_t*>(in_.targets.data()) + first,
                                        kjit::IndexType::kInt64, rows),
         .loss = TensorView::Vector(static_cast<float*>(loss_parts_.view.data) + c, DType::kF32, 1),
         .grad = chunk,  // in place
         .grad_output = in_.inv_valid.view,
         .workspace = ce_workspace_.data(),
         .workspace_bytes = static_cast<int64_t>(ce_workspace_.bytes())}));
    KJIT_RETURN_IF_ERROR(mm.Run(chunk, true, y_rows, false, dlm_head_.view, c == 0 ? 0.0f : 1.0f));
    KJIT_RETURN_IF_ERROR(mm.Run(chunk, false, in_.lm_head.view, false, Rows(dy, first, rows)));
  }
  logits.Free();
  y.Free();

  return norm_->Backward(nullptr,
                         {.dy = dy,
                          .x = hidden,
                          .weight = weight,
                          .rstd = rstd.view,
                          .dx = dx_.view,  // in place
                          .dw = dnorm_weight_.view,
                          .workspace = norm_workspace_.data(),
                          .workspace_bytes = static_cast<int64_t>(norm_workspace_.bytes())});
}

}  // namespace

absl::StatusOr<std::unique_ptr<Path>> MakeKjitPath(const kjit::Runtime& rt, const Problem& problem,
                                                   const SharedInputs& in, int64_t chunk_rows,
                                                   std::string name) {
  auto path = std::make_unique<KjitPath>(rt, problem, in, chunk_rows, std::move(name));
  KJIT_RETURN_IF_ERROR(path->Init());
  return path;
}

}  // namespace finetune
