// The baseline: the step as an eager framework runs it (PyTorch with Hugging Face's LlamaRMSNorm
// and the common `logits.float()` before F.cross_entropy), one kernel per operation, each result a
// new tensor, every tensor freed right after its last use.
//
// That last point favours the baseline: Hugging Face keeps the bf16 logits alive in the model's
// output, older versions also copy the shifted fp32 logits, and autograd makes a few more [tokens,
// hidden] temporaries in the norm's backward than the ones here (the tiny per-row steps, mean, add
// and rsqrt, are fused into one kernel). A real framework needs this much memory or more.
#include "bench/finetune_step/step.h"

namespace finetune {

namespace {

using kjit::DType;

class BaselinePath : public Path {
 public:
  BaselinePath(const kjit::Runtime& rt, const Problem& problem, const SharedInputs& in,
               const EagerKernels& kernels)
      : Path(rt, problem, in, "baseline"), k_(kernels) {}

  absl::Status Init() {
    KJIT_RETURN_IF_ERROR(AllocateCommon());
    KJIT_RETURN_IF_ERROR(AllocateMatmul());
    KJIT_ASSIGN_OR_RETURN(loss_, pool_.NewTensor("loss", DType::kF32, 1, 1));
    return absl::OkStatus();
  }

  absl::StatusOr<double> Loss() const override {
    KJIT_ASSIGN_OR_RETURN(std::vector<double> loss, Download(rt_, loss_.view));
    return loss[0];
  }

  absl::Status Step() override;

 private:
  absl::StatusOr<Tensor> New(const char* what, DType dtype, int64_t rows, int64_t cols) {
    return pool_.NewTensor(what, dtype, rows, cols);
  }

  const EagerKernels& k_;
  Tensor loss_;
};

absl::Status BaselinePath::Step() {
  const int64_t n = problem_.tokens(), h = problem_.hidden, v = problem_.vocab;
  const DType f32 = DType::kF32, bf16 = DType::kBF16;
  LtMatmul& mm = *matmul_;

  // The final norm: x32 = x.float(); rstd = rsqrt(x32.pow(2).mean(-1) + eps);
  // normed = (x32 * rstd).to(bf16); y = w * normed. x32, rstd, normed and y are saved.
  KJIT_ASSIGN_OR_RETURN(Tensor x32, New("x.float()", f32, n, h));
  KJIT_RETURN_IF_ERROR(k_.Cast(in_.hidden.view, x32.view));
  KJIT_ASSIGN_OR_RETURN(Tensor rstd, New("rstd", f32, n, 1));
  {
    KJIT_ASSIGN_OR_RETURN(Tensor squares, New("x.pow(2)", f32, n, h));
    KJIT_RETURN_IF_ERROR(k_.Square(x32.view, squares.view));
    KJIT_RETURN_IF_ERROR(k_.Rstd(squares.view, problem_.eps, rstd.view));
  }
  KJIT_ASSIGN_OR_RETURN(Tensor normed, New("normed", bf16, n, h));
  {
    KJIT_ASSIGN_OR_RETURN(Tensor scaled, New("x * rstd", f32, n, h));
    KJIT_RETURN_IF_ERROR(k_.Mul(x32.view, rstd.view, scaled.view));
    KJIT_RETURN_IF_ERROR(k_.Cast(scaled.view, normed.view));
  }
  KJIT_ASSIGN_OR_RETURN(Tensor y, New("y", bf16, n, h));
  KJIT_RETURN_IF_ERROR(k_.Mul(normed.view, in_.norm_weight.view, y.view));

  // lm_head, logits.float(), log_softmax (saved for its backward), nll_loss.
  KJIT_ASSIGN_OR_RETURN(Tensor logp, New("log_softmax", f32, n, v));
  {
    KJIT_ASSIGN_OR_RETURN(Tensor logits, New("logits", bf16, n, v));
    KJIT_RETURN_IF_ERROR(mm.Run(y.view, false, in_.lm_head.view, true, logits.view));
    KJIT_ASSIGN_OR_RETURN(Tensor logits32, New("logits.float()", f32, n, v));
    KJIT_RETURN_IF_ERROR(k_.Cast(logits.view, logits32.view));
    logits.Free();
    KJIT_RETURN_IF_ERROR(k_.LogSoftmax(logits32.view, logp.view));
  }
  KJIT_ASSIGN_OR_RETURN(Tensor total_weight, New("total_weight", f32, 1, 1));
  KJIT_RETURN_IF_ERROR(
      k_.NllLoss(logp.view, in_.targets.data(), kIgnoreIndex, loss_.view, total_weight.view));

  // Backward, node by node as autograd runs it. nll_loss and log_softmax: three fp32
  // [tokens, vocab] tensors live at once (log_softmax's output, its gradient, the logits').
  Tensor dlogits32;
  {
    KJIT_ASSIGN_OR_RETURN(Tensor dlogp, New("grad of log_softmax", f32, n, v));
    KJIT_RETURN_IF_ERROR(
        k_.NllLossBackward(in_.targets.data(), kIgnoreIndex, total_weight.view, dlogp.view));
    KJIT_ASSIGN_OR_RETURN(dlogits32, New("grad of logits.float()", f32, n, v));
    KJIT_RETURN_IF_ERROR(k_.LogSoftmaxBackward(dlogp.view, logp.view, dlogits32.view));
  }
  logp.Free();
  KJIT_ASSIGN_OR_RETURN(Tensor dlogits, New("grad of logits", bf16, n, v));
  KJIT_RETURN_IF_ERROR(k_.Cast(dlogits32.view, dlogits.view));
  dlogits32.Free();

  // lm_head: dW = dlogitsᵀ · y, dy = dlogits · W.
  KJIT_RETURN_IF_ERROR(mm.Run(dlogits.view, true, y.view, false, dlm_head_.view));
  KJIT_ASSIGN_OR_RETURN(Tensor dy, New("grad of y", bf16, n, h));
  KJIT_RETURN_IF_ERROR(mm.Run(dlogits.view, false, in_.lm_head.view, false, dy.view));
  dlogits.Free();
  y.Free();

  // The norm. y = w * normed: dw = sum over tokens of dy * normed, dnormed = dy * w (bf16).
  {
    KJIT_ASSIGN_OR_RETURN(Tensor prod, New("dy * normed", bf16, n, h));
    KJIT_RETURN_IF_ERROR(k_.Mul(dy.view, normed.view, prod.view));
    KJIT_RETURN_IF_ERROR(k_.ColumnSum(prod.view, dnorm_weight_.view));
  }
  normed.Free();
  KJIT_ASSIGN_OR_RETURN(Tensor dscaled, New("grad of x * rstd", f32, n, h));
  {
    KJIT_ASSIGN_OR_RETURN(Tensor dnormed, New("grad of normed", bf16, n, h));
    KJIT_RETURN_IF_ERROR(k_.Mul(dy.view, in_.norm_weight.view, dnormed.view));
    KJIT_RETURN_IF_ERROR(k_.Cast(dnormed.view, dscaled.view));
  }
  dy.Free();
  // x * rstd: dx32 = dscaled * rstd + x32 * coef, coef the gradient through rstd.
  KJIT_ASSIGN_OR_RETURN(Tensor coef, New("grad through rstd", f32, n, 1));
  {
    KJIT_ASSIGN_OR_RETURN(Tensor prod, New("dscaled * x", f32, n, h));
    KJIT_RETURN_IF_ERROR(k_.Mul(dscaled.view, x32.view, prod.view));
    KJIT_RETURN_IF_ERROR(k_.RstdBackward(prod.view, rstd.view, coef.view));
  }
  KJIT_ASSIGN_OR_RETURN(Tensor direct, New("dscaled * rstd", f32, n, h));
  KJIT_RETURN_IF_ERROR(k_.Mul(dscaled.view, rstd.view, direct.view));
  dscaled.Free();
  KJIT_ASSIGN_OR_RETURN(Tensor through, New("x * coef", f32, n, h));
  KJIT_RETURN_IF_ERROR(k_.Mul(x32.view, coef.view, through.view));
  x32.Free();
  KJIT_ASSIGN_OR_RETURN(Tensor dx32, New("grad of x.float()", f32, n, h));
  KJIT_RETURN_IF_ERROR(k_.Add(direct.view, through.view, dx32.view));
  direct.Free();
  through.Free();
  return k_.Cast(dx32.view, dx_.view);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Path>> MakeBaselinePath(const kjit::Runtime& rt,
                                                       const Problem& problem,
                                                       const SharedInputs& in,
                                                       const EagerKernels& kernels) {
  auto path = std::make_unique<BaselinePath>(rt, problem, in, kernels);
  KJIT_RETURN_IF_ERROR(path->Init());
  return path;
}

}  // namespace finetune
