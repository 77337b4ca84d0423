// LtMatmul: the lm_head's three bf16 GEMMs (logits, the weight gradient, the input gradient)
// through cuBLASLt, stated on row-major views as a framework would: out = op(a) · op(b), with fp32
// accumulation and bf16 output, optionally added to what `out` holds (beta = 1).
//
// cuBLASLt runs in the context current on the calling thread, which is the kjit Runtime's primary
// context; it launches into the same stream as the kjit ops. A plan (descriptors and the
// heuristic's algorithm) is made once per shape and reused, so a step makes no host-side choices.
//
//   KJIT_ASSIGN_OR_RETURN(auto mm, LtMatmul::Create(workspace.data(), workspace.bytes()));
//   KJIT_RETURN_IF_ERROR(mm->Run(y, false, lm_head, true, logits));           // y · Wᵀ
//   KJIT_RETURN_IF_ERROR(mm->Run(dlogits, true, y, false, d_lm_head, 1.0f));  // += dlogitsᵀ · y
#pragma once

#include <cublasLt.h>

#include <map>
#include <memory>
#include <tuple>

#include "kjit/kjit.h"

namespace finetune {

class LtMatmul {
 public:
  // cuBLASLt's recommended workspace on Hopper and Blackwell.
  static constexpr size_t kWorkspaceBytes = size_t{32} << 20;

  // `workspace` (device memory of `workspace_bytes`) is the caller's, so that it is counted.
  static absl::StatusOr<std::unique_ptr<LtMatmul>> Create(void* workspace, size_t workspace_bytes);
  ~LtMatmul();
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  // out = op(a) · op(b) + beta · out, op transposing when asked; all bf16, rows may be strided.
  // InvalidArgument names the argument whose shape or dtype does not fit.
  absl::Status Run(const kjit::TensorView& a, bool transpose_a, const kjit::TensorView& b,
                   bool transpose_b, const kjit::TensorView& out, float beta = 0.0f);

 private:
  // Descriptors of one shape and the heuristic's algorithm for it.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    // cuBLASLt's operands: the first is b, the second a (see PlanFor).
    cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
    cublasLtMatmulAlgo_t algo{};
    Plan() = default;
    Plan(const Plan&) = delete;
    Plan& operator=(const Plan&) = delete;
    ~Plan();
  };
  // transpose a and b, m, n, k, the three leading dimensions, and the pointers' alignment.
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int>;

  LtMatmul(cublasLtHandle_t handle, void* workspace, size_t workspace_bytes)
      : handle_(handle), workspace_(workspace), workspace_bytes_(workspace_bytes) {}
  absl::StatusOr<const Plan*> PlanFor(const Key& key);

  cublasLtHandle_t handle_;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, std::unique_ptr<Plan>> plans_;
};

}  // namespace finetune
