#include "ops/linear_cross_entropy/tuning/unfused.h"

#include "runtime/runtime_state.h"

namespace kjit::ops {

absl::StatusOr<std::unique_ptr<UnfusedLinearCrossEntropy>> UnfusedLinearCrossEntropy::Create(
    const Runtime& rt, const CrossEntropySpec& loss, const Views& views) {
  std::unique_ptr<UnfusedLinearCrossEntropy> u(new UnfusedLinearCrossEntropy());
  u->views_ = views;
  KJIT_ASSIGN_OR_RETURN(u->ce_, rt.CrossEntropy(loss));
  KJIT_ASSIGN_OR_RETURN(const CublasLt* lt, CublasLt::Get());
  KJIT_ASSIGN_OR_RETURN(u->lt_, LtGemm::Create(*lt));
  u->own_ = std::make_unique<HopperGemm>(internal::StateOf(rt));
  KJIT_ASSIGN_OR_RETURN(u->lt_workspace_, DeviceBuffer::Create(rt, LtGemm::kWorkspaceBytes));
  const int64_t rows = views.hidden.rows;
  KJIT_ASSIGN_OR_RETURN(u->logits_,
                        DeviceBuffer::Create(rt, rows * loss.vocab * SizeOf(loss.dtype)));
  KJIT_ASSIGN_OR_RETURN(u->ce_workspace_, DeviceBuffer::Create(rt, u->ce_->WorkspaceBytes(rows)));
  const TensorView x = TensorView::Matrix(u->logits_->data(), loss.dtype, rows, loss.vocab);
  u->gemms_[kLogits] = {.a = views.hidden, .b = views.weight, .transpose_b = true, .out = x};
  u->gemms_[kDHidden] = {.a = x, .b = views.weight, .out = views.d_hidden};
  u->gemms_[kDWeight] = {.a = x, .transpose_a = true, .b = views.hidden, .out = views.d_weight};
  return u;
}

absl::Status UnfusedLinearCrossEntropy::RunGemm(Gemm gemm, CUstream stream, int algo) {
  GemmArgs args = gemms_[gemm];
  args.algo = algo;
  if (algo == kOwnGemm) {
    KJIT_ASSIGN_OR_RETURN(const GemmShape s, ShapeOf(args));
    return own_->Run(args, DefaultGemmConfig(s.m, s.n, s.k), stream);
  }
  return lt_->Run(args, lt_workspace_->data(), stream);
}

absl::Status UnfusedLinearCrossEntropy::Loss(CUstream stream) {
  const TensorView x = logits();
  return ce_->ForwardBackward(stream, {.logits = x,
                                       .targets = views_.targets,
                                       .loss = views_.loss,
                                       .grad = x,
                                       .workspace = ce_workspace_->data(),
                                       .workspace_bytes = ce_->WorkspaceBytes(x.rows)});
}

absl::Status UnfusedLinearCrossEntropy::Run(CUstream stream) {
  KJIT_RETURN_IF_ERROR(RunGemm(kLogits, stream));
  KJIT_RETURN_IF_ERROR(Loss(stream));
  KJIT_RETURN_IF_ERROR(RunGemm(kDHidden, stream));
  return RunGemm(kDWeight, stream);
}

}  // namespace kjit::ops
