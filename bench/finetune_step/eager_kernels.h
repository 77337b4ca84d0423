// EagerKernels: the baseline's device code, one kernel per tensor operation as an eager framework
// (PyTorch without torch.compile) launches them, each writing its whole result to memory; and the
// counter-based random fill that makes the example's inputs on the device.
//
// The kernels are JIT-compiled through the kjit Runtime's Jit (so they share its disk cache and
// trace) for the GPU present. Operands are TensorViews; shapes say how an operand broadcasts
// ([rows, cols], [1, cols] per column, [rows, 1] per row), as in a framework. Every launch goes to
// the default stream.
//
//   KJIT_ASSIGN_OR_RETURN(EagerKernels k, EagerKernels::Create(rt, /*vec=*/4));
//   KJIT_RETURN_IF_ERROR(k.Cast(logits, logits_f32));       // logits.float()
//   KJIT_RETURN_IF_ERROR(k.LogSoftmax(logits_f32, logp));
#pragma once

#include <cstdint>
#include <memory>

#include "jit/loaded_module.h"
#include "jit/source.h"
#include "kjit/kjit.h"

namespace finetune {

// The program EagerKernels compiles, with `vec` (4 or 1) elements per access; no GPU needed.
absl::StatusOr<kjit::jit::Source> EagerKernelsSource(int vec);

class EagerKernels {
 public:
  // `vec` (4 or 1) elements per access: 4 needs every row length to be a multiple of 4.
  static absl::StatusOr<EagerKernels> Create(const kjit::Runtime& rt, int vec);

  // Normal random values, value i a function of (seed, i) alone.
  absl::Status FillNormal(const kjit::TensorView& out, uint64_t seed, float mean,
                          float stddev) const;

  // out = a converted to out's dtype (Tensor.to).
  absl::Status Cast(const kjit::TensorView& a, const kjit::TensorView& out) const;
  absl::Status Square(const kjit::TensorView& a, const kjit::TensorView& out) const;
  // out = a * b and a + b, computed in fp32; b is a's shape, [1, cols] or [rows, 1].
  absl::Status Mul(const kjit::TensorView& a, const kjit::TensorView& b,
                   const kjit::TensorView& out) const;
  absl::Status Add(const kjit::TensorView& a, const kjit::TensorView& b,
                   const kjit::TensorView& out) const;
  // Sums over rows into out [1, cols] (a broadcast multiply's gradient).
  absl::Status ColumnSum(const kjit::TensorView& a, const kjit::TensorView& out) const;

  // rstd [rows, 1] = rsqrt(mean(squares per row) + eps).
  absl::Status Rstd(const kjit::TensorView& squares, float eps, const kjit::TensorView& rstd) const;
  // coef [rows, 1] = -rstd^3 / cols * sum(prod per row): the gradient that reaches x through rstd
  // is x * coef, where prod = (gradient of x * rstd) * x.
  absl::Status RstdBackward(const kjit::TensorView& prod, const kjit::TensorView& rstd,
                            const kjit::TensorView& coef) const;

  // fp32 rows: log_softmax and its backward (grad_in = grad_out - exp(out) * sum(grad_out)).
  absl::Status LogSoftmax(const kjit::TensorView& in, const kjit::TensorView& out) const;
  absl::Status LogSoftmaxBackward(const kjit::TensorView& grad_out, const kjit::TensorView& out,
                                  const kjit::TensorView& grad_in) const;
  // Mean negative log-likelihood over rows whose int64 target is not ignore_index; also writes the
  // number of such rows (total_weight, fp32 [1]) for the backward, which scatters
  // -1 / total_weight at each valid target into a zeroed grad.
  absl::Status NllLoss(const kjit::TensorView& logp, const void* targets, int64_t ignore_index,
                       const kjit::TensorView& loss, const kjit::TensorView& total_weight) const;
  absl::Status NllLossBackward(const void* targets, int64_t ignore_index,
                               const kjit::TensorView& total_weight,
                               const kjit::TensorView& grad) const;

 private:
  EagerKernels(const kjit::jit::Driver& cu, std::shared_ptr<const kjit::jit::LoadedModule> module,
               int vec, int sm_count)
      : cu_(&cu), module_(std::move(module)), vec_(vec), sm_count_(sm_count) {}
  absl::Status Launch(const std::string& kernel, int64_t grid, int block, void** args) const;
  // An elementwise kernel over n elements, `vec` at a time, with a grid that fills the GPU.
  absl::Status LaunchElementwise(const std::string& kernel, int64_t n, int vec, void** args) const;
  absl::Status Unary(int op, const kjit::TensorView& a, const kjit::TensorView& out) const;
  absl::Status Binary(int op, const kjit::TensorView& a, const kjit::TensorView& b,
                      const kjit::TensorView& out) const;

  const kjit::jit::Driver* cu_;
  std::shared_ptr<const kjit::jit::LoadedModule> module_;
  int vec_;
  int sm_count_;
};

}  // namespace finetune
