#include "bench/finetune_step/lt_matmul.h"

#include <fmt/format.h>

#include <cstdint>

namespace finetune {

namespace {

absl::Status LtCheck(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(fmt::format("{} failed: {} ({})", call, cublasLtGetStatusName(s),
                                         cublasLtGetStatusString(s)));
}

// The largest power of two up to 256 (cuBLASLt's default assumption) dividing every address.
int CommonAlignment(std::initializer_list<const void*> pointers) {
  int alignment = 256;
  for (const void* p : pointers) {
    while (reinterpret_cast<uintptr_t>(p) % alignment != 0) alignment /= 2;
  }
  return alignment;
}

}  // namespace

LtMatmul::Plan::~Plan() {
  if (desc) cublasLtMatmulDescDestroy(desc);
  for (cublasLtMatrixLayout_t l : {first, second, out}) {
    if (l) cublasLtMatrixLayoutDestroy(l);
  }
}

absl::StatusOr<std::unique_ptr<LtMatmul>> LtMatmul::Create(void* workspace,
                                                           size_t workspace_bytes) {
  cublasLtHandle_t handle = nullptr;
  KJIT_RETURN_IF_ERROR(LtCheck(cublasLtCreate(&handle), "cublasLtCreate"));
  return std::unique_ptr<LtMatmul>(new LtMatmul(handle, workspace, workspace_bytes));
}

LtMatmul::~LtMatmul() {
  plans_.clear();
  cublasLtDestroy(handle_);
}

absl::StatusOr<const LtMatmul::Plan*> LtMatmul::PlanFor(const Key& key) {
  if (auto it = plans_.find(key); it != plans_.end()) return it->second.get();
  const auto [transpose_a, transpose_b, m, n, k, lda, ldb, ldd, alignment] = key;
  // cuBLASLt is column-major, where a row-major matrix reads as its transpose: out = op(a) op(b)
  // is outᵀ = op(b)ᵀ op(a)ᵀ, so cuBLASLt's first operand is b and its second is a.
  auto plan = std::make_unique<Plan>();
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
              "cublasLtMatmulDescCreate"));
  const cublasOperation_t op_first = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                             sizeof(op_first)),
              "cublasLtMatmulDescSetAttribute"));
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                             sizeof(op_second)),
              "cublasLtMatmulDescSetAttribute"));
  // Stored shapes (before op), column-major: b is [n, k] or [k, n] row-major, so its columns are
  // its rows.
  const uint64_t b_rows = transpose_b ? k : n, b_cols = transpose_b ? n : k;
  const uint64_t a_rows = transpose_a ? m : k, a_cols = transpose_a ? k : m;
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatrixLayoutCreate(&plan->first, CUDA_R_16BF, b_rows, b_cols, ldb),
              "cublasLtMatrixLayoutCreate"));
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatrixLayoutCreate(&plan->second, CUDA_R_16BF, a_rows, a_cols, lda),
              "cublasLtMatrixLayoutCreate"));
  KJIT_RETURN_IF_ERROR(LtCheck(cublasLtMatrixLayoutCreate(&plan->out, CUDA_R_16BF, n, m, ldd),
                               "cublasLtMatrixLayoutCreate"));

  cublasLtMatmulPreference_t pref = nullptr;
  KJIT_RETURN_IF_ERROR(
      LtCheck(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"));
  const uint64_t max_workspace = workspace_bytes_;
  const uint32_t align = static_cast<uint32_t>(alignment);
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &max_workspace, sizeof(max_workspace));
  for (auto attr :
       {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    if (s == CUBLAS_STATUS_SUCCESS) {
      s = cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS) {
    s = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->first, plan->second, plan->out,
                                       plan->out, pref, 1, &result, &found);
  }
  cublasLtMatmulPreferenceDestroy(pref);
  KJIT_RETURN_IF_ERROR(LtCheck(s, "cublasLtMatmulAlgoGetHeuristic"));
  if (found == 0) {
    return absl::NotFoundError(fmt::format(
        "cuBLASLt has no bf16 algorithm for m={} n={} k={} (transpose a={} b={}, {}-byte aligned)",
        m, n, k, transpose_a, transpose_b, alignment));
  }
  plan->algo = result.algo;
  return (plans_[key] = std::move(plan)).get();
}

absl::Status LtMatmul::Run(const kjit::TensorView& a, bool transpose_a, const kjit::TensorView& b,
                           bool transpose_b, const kjit::TensorView& out, float beta) {
  for (const auto& [name, v] :
       {std::pair<const char*, const kjit::TensorView*>{"a", &a}, {"b", &b}, {"out", &out}}) {
    if (v->dtype != kjit::DType::kBF16 || v->empty()) {
      return absl::InvalidArgumentError(fmt::format("{}: must be a bf16 matrix", name));
    }
  }
  const int64_t m = transpose_a ? a.cols : a.rows, k = transpose_a ? a.rows : a.cols;
  const int64_t b_inner = transpose_b ? b.cols : b.rows, n = transpose_b ? b.rows : b.cols;
  if (b_inner != k) {
    return absl::InvalidArgumentError(
        fmt::format("b: op(b) has {} rows, op(a) has {} columns", b_inner, k));
  }
  if (out.rows != m || out.cols != n) {
    return absl::InvalidArgumentError(
        fmt::format("out: is {}x{}, op(a) op(b) is {}x{}", out.rows, out.cols, m, n));
  }
  const Key key{transpose_a,
                transpose_b,
                m,
                n,
                k,
                a.row_stride,
                b.row_stride,
                out.row_stride,
                CommonAlignment({a.data, b.data, out.data})};
  KJIT_ASSIGN_OR_RETURN(const Plan* plan, PlanFor(key));
  const float alpha = 1.0f;
  return LtCheck(cublasLtMatmul(handle_, plan->desc, &alpha, b.data, plan->first, a.data,
                                plan->second, &beta, out.data, plan->out, out.data, plan->out,
                                &plan->algo, workspace_, workspace_bytes_, /*stream=*/nullptr),
                 "cublasLtMatmul");
}

}  // namespace finetune
