// UnfusedLinearCrossEntropy: the path the fused op is checked and timed against, with the same
// math and none of its chunking: the whole [rows x vocab] logits from cuBLASLt (its heuristic's
// first algorithm unless RunGemm names another), kjit's cross-entropy over them with the gradient
// written in place, then cuBLASLt's d_hidden = dlogits · W and d_weight = dlogitsᵀ · h. It owns
// the logits and the two workspaces; the caller owns the tensors the views name. Used by the
// trial, `kjit bench` and the GPU tests, so that the three hold the op to one baseline.
//
//   KJIT_ASSIGN_OR_RETURN(std::unique_ptr<UnfusedLinearCrossEntropy> unfused,
//                         UnfusedLinearCrossEntropy::Create(rt, {.vocab = 128256}, {
//                             .hidden = h, .weight = w, .targets = t, .loss = loss,
//                             .d_hidden = dh, .d_weight = dw_fp32}));
//   KJIT_RETURN_IF_ERROR(unfused->Run(stream));
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "kjit/kjit.h"
#include "ops/gemm/hopper_gemm.h"
#include "ops/linear_cross_entropy/cublaslt.h"

namespace kjit::ops {

class UnfusedLinearCrossEntropy {
 public:
  struct Views {
    TensorView hidden;    // [rows, hidden] in the loss spec's dtype
    TensorView weight;    // [vocab, hidden]
    IndexView targets;    // [rows]
    TensorView loss;      // fp32, as the loss spec's reduction asks (not none)
    TensorView d_hidden;  // [rows, hidden] in the dtype
    TensorView d_weight;  // [vocab, hidden] in the dtype or fp32
  };
  enum Gemm { kLogits, kDHidden, kDWeight };

  // Allocates the logits ([rows, vocab] in the dtype) and the workspaces, so that a failure to
  // fit is an error here, not in a launch.
  static absl::StatusOr<std::unique_ptr<UnfusedLinearCrossEntropy>> Create(
      const Runtime& rt, const CrossEntropySpec& loss, const Views& views);

  // One GEMM of the three, with the `algo`-th of cuBLASLt's heuristic algorithms for its shape
  // (GemmArgs::algo), or with kjit's own GEMM (kOwnGemm: FailedPrecondition where it does not
  // apply); the gradient GEMMs read what Loss left in the logits.
  absl::Status RunGemm(Gemm gemm, CUstream stream, int algo = 0);
  // The cross-entropy over the logits the logits GEMM wrote, its gradient in their place.
  absl::Status Loss(CUstream stream);
  // The logits GEMM, the loss, then the two gradient GEMMs.
  absl::Status Run(CUstream stream);

  const GemmArgs& gemm_args(Gemm gemm) const { return gemms_[gemm]; }
  TensorView logits() const { return gemms_[kLogits].out; }
  const CrossEntropy& cross_entropy() const { return *ce_; }
  LtGemm& lt_gemm() { return *lt_; }

 private:
  UnfusedLinearCrossEntropy() = default;

  Views views_;
  std::optional<CrossEntropy> ce_;
  std::unique_ptr<LtGemm> lt_;
  std::unique_ptr<HopperGemm> own_;
  std::optional<DeviceBuffer> lt_workspace_, logits_, ce_workspace_;
  GemmArgs gemms_[3];
};

}  // namespace kjit::ops
