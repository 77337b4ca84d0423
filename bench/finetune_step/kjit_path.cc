// The kjit path: kjit's RMSNorm (rstd saved for the backward), then the lm_head and the loss as
// one kjit::LinearCrossEntropy (cuBLASLt's logits over chunks of `chunk_rows` rows, the fused
// cross-entropy turning each chunk into its gradient in place, the two gradient GEMMs, the mean
// over the valid targets made on the device), writing the lm_head's input gradient where dx goes,
// then kjit's RMSNorm backward in place over it. The lm_head's gradient adds up over the chunks in
// fp32 (the op's default) and is rounded to bf16 once.
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
        chunk_rows_(std::min(chunk_rows, problem.tokens())) {}

  absl::Status Init() {
    KJIT_RETURN_IF_ERROR(AllocateCommon());
    KJIT_ASSIGN_OR_RETURN(
        norm_,
        rt_.RmsNorm({.hidden = problem_.hidden, .dtype = DType::kBF16, .eps = problem_.eps}));
    KJIT_ASSIGN_OR_RETURN(
        head_, rt_.LinearCrossEntropy(
                   {.vocab = problem_.vocab,
                    .hidden = problem_.hidden,
                    .dtype = DType::kBF16,
                    .loss = {.ignore_index = kIgnoreIndex, .reduction = kjit::Reduction::kMean},
                    .config = kjit::LinearCrossEntropyConfig{.chunk_rows = chunk_rows_}}));
    KJIT_ASSIGN_OR_RETURN(loss_, pool_.NewTensor("loss", DType::kF32, 1, 1));
    KJIT_ASSIGN_OR_RETURN(
        head_workspace_,
        pool_.Allocate("lm_head + loss workspace", head_->WorkspaceBytes(problem_.tokens())));
    KJIT_ASSIGN_OR_RETURN(norm_workspace_,
                          pool_.Allocate("RMSNorm backward workspace",
                                         norm_->BackwardWorkspaceBytes(problem_.tokens())));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Loss() const override {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> loss, Download(rt_, loss_.view));
    return loss[0];
  }

  absl::Status Step() override;

 private:
  const int64_t chunk_rows_;
  std::optional<kjit::RmsNorm> norm_;
  std::optional<kjit::LinearCrossEntropy> head_;
  Tensor loss_;
  Buffer head_workspace_, norm_workspace_;
};

absl::Status KjitPath::Step() {
  const int64_t n = problem_.tokens(), h = problem_.hidden;
  const TensorView hidden = in_.hidden.view, weight = in_.norm_weight.view;

  KJIT_ASSIGN_OR_RETURN(Tensor y, pool_.NewTensor("y", DType::kBF16, n, h));
  KJIT_ASSIGN_OR_RETURN(Tensor rstd, pool_.NewTensor("rstd", DType::kF32, 1, n));
  KJIT_RETURN_IF_ERROR(
      norm_->Forward(nullptr, {.x = hidden, .weight = weight, .y = y.view, .rstd = rstd.view}));

  const TensorView dy = dx_.view;  // the lm_head's input gradient goes where dx will be
  KJIT_RETURN_IF_ERROR(head_->ForwardBackward(
      nullptr, {.hidden_states = y.view,
                .weight = in_.lm_head.view,
                .targets = kjit::IndexView::Of(in_.targets.data(), kjit::IndexType::kInt64, n),
                .loss = loss_.view,
                .d_hidden = dy,
                .d_weight = dlm_head_.view,
                .workspace = head_workspace_.data(),
                .workspace_bytes = static_cast<int64_t>(head_workspace_.bytes())}));
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
